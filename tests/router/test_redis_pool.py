"""Redis under load (issue 24.4): a pool sized for the load, whose callers wait for a free connection; a wait that
runs out is `busy` (answered in-process, counted apart), never Redis being down; only a real failure (refused,
reset, a server error, a command that times out) opens the breaker; one log line when Redis goes, one when it is
back. Each test starts its own `redis-server` (tests/router/_redis.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

import router._sessions.store
from router._observe.metrics import Metrics
from router._sessions.store import RedisStore, SharedAnswers
from tests.router._redis import RedisServer

pytestmark = pytest.mark.anyio

CALLS = 200  # more than the 64 connections the pool used to allow


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The store's log lines about Redis's state."""
    return [
        r.getMessage() for r in caplog.records if r.name == "router._sessions.store" and r.levelno >= logging.WARNING
    ]


def counted(metrics: Metrics) -> dict[tuple[str, str], float]:
    """Every `d3router_redis_*` and `d3router_shared_cache` series that counted something, by (name, label)."""
    return {
        (sample.name, ",".join(sample.labels.values())): sample.value
        for family in text_string_to_metric_families(metrics.render())
        if family.name.startswith(("d3router_redis", "d3router_shared_cache"))
        for sample in family.samples
        if sample.value and sample.name.endswith("_total")
    }


async def test_200_concurrent_calls_do_not_mark_redis_down(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="router._sessions.store")
    metrics = Metrics()
    # A timeout no machine misses: what is checked is the pool, not the speed of the test's host.
    store = RedisStore(redis_server.url, timeout_s=5.0, metrics=metrics)
    try:
        await asyncio.gather(*(store.put(f"k{i}", f"v{i}", 60) for i in range(CALLS)))
        got = await asyncio.gather(*(store.fetch(f"k{i}") for i in range(CALLS)))
        assert got == [f"v{i}" for i in range(CALLS)]  # every one answered by Redis itself
        assert store.usable()
        assert lines(caplog) == []
        assert counted(metrics) == {}  # no error, no fallback, no busy
        with redis_server.client() as client:
            assert client.dbsize() == CALLS
    finally:
        await store.aclose()


async def test_more_calls_than_connections_wait_for_one(redis_server: RedisServer) -> None:
    metrics = Metrics()
    store = RedisStore(redis_server.url, timeout_s=5.0, metrics=metrics, max_connections=4)
    try:
        await asyncio.gather(*(store.set(f"k{i}", "v", 60) for i in range(CALLS)))
        assert await asyncio.gather(*(store.fetch(f"k{i}") for i in range(CALLS))) == ["v"] * CALLS
        assert counted(metrics) == {}
        with redis_server.client() as client:
            assert int(client.info("clients")["connected_clients"]) <= 4 + 1  # ours, and this one
    finally:
        await store.aclose()


async def test_no_free_connection_in_time_is_busy_not_down(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="router._sessions.store")
    metrics = Metrics()
    store = RedisStore(redis_server.url, timeout_s=0.05, metrics=metrics, max_connections=1)
    shared = SharedAnswers(store, metrics, b"salt")
    try:
        await store.set("session", "large", 60)
        # Every connection in use (the pool's one slot held here, as a long call would): the wait runs out.
        await store._slots.acquire()
        try:
            assert await store.get("session", 60) == "large"  # from the in-process copy
            assert await shared.get("ab" * 16) is None
            assert store.usable()
        finally:
            store._slots.release()
        assert lines(caplog) == []
        assert counted(metrics) == {
            ("d3router_redis_busy_total", "get"): 1.0,
            ("d3router_redis_busy_total", "answers_get"): 1.0,
            ("d3router_shared_cache_total", "busy"): 1.0,
        }
        with redis_server.client() as client:
            client.set("session", "small")
        assert await store.get("session", 60) == "small"  # a connection free again: Redis answers
    finally:
        await store.aclose()


async def test_a_killed_redis_opens_the_breaker_once_and_recovery_closes_it_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="router._sessions.store")
    monkeypatch.setattr(router._sessions.store, "RETRY_S", 0.0)  # a probe as soon as asked: no wait on the clock here
    metrics = Metrics()
    store = RedisStore(redis_server.url, timeout_s=5.0, metrics=metrics)
    try:
        await asyncio.gather(*(store.set(f"k{i}", "v", 60) for i in range(CALLS)))
        redis_server.stop()
        assert await asyncio.gather(*(store.get(f"k{i}", 60) for i in range(CALLS))) == ["v"] * CALLS
        assert store._down
        [down] = lines(caplog)
        assert down.startswith(f"redis {redis_server.url} failed (")
        assert counted(metrics)[("d3router_redis_errors_total", "get")] >= 1
        assert ("d3router_redis_busy_total", "get") not in counted(metrics)
        restarted = RedisServer(redis_server.port).start()
        try:
            for _ in range(3):  # the first round's probe closes the breaker; the others find it closed
                await asyncio.gather(*(store.set(f"k{i}", "w", 60) for i in range(CALLS)))
            assert not store._down
            up = f"redis {redis_server.url} answers again; sessions and decisions are shared again"
            assert lines(caplog)[1:] == [up]
            with restarted.client() as client:
                assert client.get(f"k{CALLS - 1}") == "w"
        finally:
            restarted.stop()
    finally:
        await store.aclose()


async def test_a_server_error_opens_the_breaker(redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="router._sessions.store")
    metrics = Metrics()
    store = RedisStore(redis_server.url, timeout_s=5.0, metrics=metrics)
    try:
        with redis_server.client() as client:  # OOM: Redis answers, with an error
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")
        await store.set("k", "v", 60)
        assert store._down
        assert lines(caplog) == [f"redis {redis_server.url} failed (OutOfMemoryError); sessions and decisions are "
                                 "kept in-process until it answers again"]  # fmt: skip
        assert counted(metrics) == {
            ("d3router_redis_errors_total", "set"): 1.0,
            ("d3router_redis_fallbacks_total", "set"): 1.0,
        }
    finally:
        await store.aclose()
