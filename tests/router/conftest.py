"""Fixtures of the router's tests: redis-servers of their own, and the spans a test's requests make."""

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router import disable_tracing, enable_tracing
from tests.router._redis import redis_cluster, redis_server

__all__ = ["redis_cluster", "redis_server", "spans"]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, its spans kept in memory for the test to read; off again after it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    enable_tracing(provider)
    yield exporter
    disable_tracing()
    provider.shutdown()
