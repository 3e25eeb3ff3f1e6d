"""Fixtures of the router's tests."""

from tests.router._redis import redis_server

__all__ = ["redis_server"]
