"""Fixtures of the router's tests."""

from tests.router._redis import redis_cluster, redis_server

__all__ = ["redis_cluster", "redis_server"]
