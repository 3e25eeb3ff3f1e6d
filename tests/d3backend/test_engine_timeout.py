"""Issue 19.8: the engine timeout holds for every engine kind, and a hung shared call cannot pin the cache.

httpx's timeouts are read by the transport; `httpx.ASGITransport` (the embedded engine's) ignores them, and so may
any injected transport. The engines bound each call themselves. `CachedEngine` releases the followers of a failed
or timed-out call with its error and caches nothing for that key. No test leaves a task behind.

Every test runs under an outer `asyncio.timeout` 100x the engine's: before the fix they hung, now they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from d3backend import (
    CachedEngine,
    Decided,
    EmbeddedEngine,
    EngineTimeout,
    EngineUnavailable,
    FakeEngine,
    Noul,
    Question,
    RemoteEngine,
    _vllm,
)
from d3backend._wire import JSONValue

pytestmark = pytest.mark.anyio

QUESTIONS: dict[str, Question] = {"jailbreak": Noul(None)}
TIMEOUT_S = 0.05
GUARD_S = 100 * TIMEOUT_S  # the outer bound: reached only when the engine's own timeout does not hold


class Hanging(httpx.AsyncBaseTransport):
    """A transport whose requests never answer; records that each was cancelled, not left running."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


def other_tasks() -> set[asyncio.Task[Any]]:
    """The tasks besides this test's and the test runner's (its tasks run tests: their coroutine is the runner's)."""
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task() and not _runner(task)}


def _runner(task: asyncio.Task[Any]) -> bool:
    return "_call_in_runner_task" in getattr(task.get_coro(), "__qualname__", "")


async def test_remote_engine_enforces_its_timeout_whatever_the_transport() -> None:
    transport = Hanging()
    async with asyncio.timeout(GUARD_S):
        async with RemoteEngine(["http://d3:8000"], model="m", timeout_s=TIMEOUT_S, transport=transport) as engine:
            with pytest.raises(EngineTimeout, match=r"^the engine at http://d3:8000 did not answer within 0\.05 s$"):
                await engine.decide("x", QUESTIONS)
    assert (transport.started, transport.cancelled) == (1, 1)
    assert other_tasks() == set()


async def test_remote_engine_retries_a_hung_url_on_the_other() -> None:
    hanging = Hanging()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            return await hanging.handle_async_request(request)
        answer = {"type": "noul", "probabilities": {"yes": 0.1, "no": 0.9}, "confidence": 0.9}
        return httpx.Response(200, json={"model": "m", "answers": {"jailbreak": answer}})

    urls = ["http://a:1", "http://b:1"]
    async with asyncio.timeout(GUARD_S):
        async with RemoteEngine(urls, model="m", timeout_s=TIMEOUT_S, transport=httpx.MockTransport(handler)) as e:
            # The first pick rotates; ask until the hung URL has been tried once.
            while hanging.started == 0:
                decided = await e.decide("x", QUESTIONS)
                assert decided.answers["jailbreak"].noul == pytest.approx(0.1)  # type: ignore[union-attr]
    assert hanging.cancelled == 1


class HangingApp:
    """An ASGI app (the embedded vLLM's place) that never answers."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def test_embedded_engine_enforces_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    app = HangingApp()

    @contextlib.asynccontextmanager
    async def serve_in_process(argv: Sequence[str]) -> AsyncIterator[HangingApp]:
        yield app

    monkeypatch.setattr(_vllm, "serve_in_process", serve_in_process)
    monkeypatch.setattr(_vllm, "is_cpu_build", lambda: False)
    async with asyncio.timeout(GUARD_S):
        async with EmbeddedEngine("local-model", timeout_s=TIMEOUT_S) as engine:
            with pytest.raises(EngineTimeout, match=r"did not answer within 0\.05 s$"):
                await engine.decide("x", QUESTIONS)
            with pytest.raises(EngineTimeout):
                await engine.probe()
    assert app.cancelled == 2
    assert other_tasks() == set()


class Gate:
    """An engine whose calls wait for `release` and then raise `error` (or answer); counts its calls."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.error = error
        self.fake = FakeEngine({"jailbreak": 0.2})

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return await self.fake.decide(state, questions)

    async def aclose(self) -> None:
        pass


async def test_a_timed_out_leader_releases_its_followers_and_caches_nothing() -> None:
    transport = Hanging()
    remote = RemoteEngine(["http://d3:8000"], model="m", timeout_s=TIMEOUT_S, transport=transport)
    async with asyncio.timeout(GUARD_S), CachedEngine(remote) as engine:
        outcomes = await asyncio.gather(*(engine.decide("same", QUESTIONS) for _ in range(5)), return_exceptions=True)
        assert [type(outcome) for outcome in outcomes] == [EngineTimeout] * 5
        assert (engine.stats.misses, engine.stats.shared, engine.stats.size) == (1, 4, 0)
        # The key is free again: the next request starts its own call instead of waiting on a dead one.
        with pytest.raises(EngineTimeout):
            await engine.decide("same", QUESTIONS)
        assert engine.stats.misses == 2
    assert (transport.started, transport.cancelled) == (2, 2)
    assert other_tasks() == set()


async def test_cached_engine_bounds_a_hung_inner_engine_of_any_kind() -> None:
    gate = Gate()  # never released: a library user's engine without a timeout of its own
    async with asyncio.timeout(GUARD_S), CachedEngine(gate, timeout_s=TIMEOUT_S) as engine:
        outcomes = await asyncio.gather(*(engine.decide("same", QUESTIONS) for _ in range(3)), return_exceptions=True)
        assert [type(outcome) for outcome in outcomes] == [EngineTimeout] * 3
        assert str(outcomes[0]) == "the decision engine did not answer within 0.05 s"
        assert engine.stats.size == 0
        gate.release.set()
        decided = await engine.decide("same", QUESTIONS)
        assert decided.cached is False
    assert gate.calls == 2
    assert other_tasks() == set()


async def test_a_failed_leader_releases_followers_that_joined_while_it_ran() -> None:
    gate = Gate(error=EngineUnavailable("down"))
    async with asyncio.timeout(GUARD_S), CachedEngine(gate) as engine:
        leader = asyncio.create_task(engine.decide("same", QUESTIONS))
        await gate.entered.wait()
        followers = [asyncio.create_task(engine.decide("same", QUESTIONS)) for _ in range(3)]
        await asyncio.sleep(0)  # let them join the call in flight
        assert engine.stats.shared == 3
        gate.release.set()
        outcomes = await asyncio.gather(leader, *followers, return_exceptions=True)
        assert [type(outcome) for outcome in outcomes] == [EngineUnavailable] * 4
        assert engine.stats.size == 0
    assert other_tasks() == set()


async def test_a_shared_call_nobody_waits_for_any_more_leaves_no_unretrieved_error() -> None:
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda loop, context: reported.append(context))
    try:
        gate = Gate(error=EngineUnavailable("down"))
        async with asyncio.timeout(GUARD_S), CachedEngine(gate) as engine:
            caller = asyncio.create_task(engine.decide("same", QUESTIONS))
            await gate.entered.wait()
            caller.cancel()  # a client that left: the shared call goes on alone
            with pytest.raises(asyncio.CancelledError):
                await caller
            gate.release.set()
            while engine.stats.size == 0 and other_tasks():
                await asyncio.sleep(0)
            del caller
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
    assert other_tasks() == set()


async def test_closing_the_cache_ends_its_calls_in_flight() -> None:
    gate = Gate()
    engine = CachedEngine(gate)
    caller = asyncio.create_task(engine.decide("same", QUESTIONS))
    await gate.entered.wait()
    async with asyncio.timeout(GUARD_S):
        await engine.aclose()
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert other_tasks() == set()
