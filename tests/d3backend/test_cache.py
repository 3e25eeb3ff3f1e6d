"""CachedEngine: hits, TTL, LRU bound, single-flight, errors not cached, cancellation, and the key."""

from __future__ import annotations

import asyncio

import pytest

from d3backend import CachedEngine, Choice, EngineUnavailable, FakeEngine, Noul, Question, Score, cache_key

pytestmark = pytest.mark.anyio

QUESTIONS: dict[str, Question] = {"jailbreak": Noul("Jailbreak?"), "kind": Choice(None, {"code": None, "chat": None})}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_hit_after_miss() -> None:
    fake = FakeEngine({"jailbreak": 0.9})
    async with CachedEngine(fake) as engine:
        first = await engine.decide("hello", QUESTIONS)
        second = await engine.decide("hello", QUESTIONS)
        third = await engine.decide("other", QUESTIONS)
        assert engine.stats.hits == 1 and engine.stats.misses == 2 and engine.stats.size == 2
    assert (first.cached, second.cached, third.cached) == (False, True, False)
    assert second.answers == first.answers
    assert len(fake.calls) == 2
    assert fake.closed  # the cache owns its engine by default


async def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    fake = FakeEngine()
    async with CachedEngine(fake, ttl_s=10, timer=clock) as engine:
        await engine.decide("x", QUESTIONS)
        clock.now = 9.9
        await engine.decide("x", QUESTIONS)
        clock.now = 10.1
        await engine.decide("x", QUESTIONS)
    assert len(fake.calls) == 2


async def test_size_is_bounded_least_recently_used_first() -> None:
    fake = FakeEngine()
    async with CachedEngine(fake, max_entries=2) as engine:
        for state in ("a", "b", "a", "c", "a", "b"):
            await engine.decide(state, QUESTIONS)
        assert engine.stats.size == 2
    assert [call[0] for call in fake.calls] == ["a", "b", "c", "b"]


async def test_identical_decisions_in_flight_share_one_call() -> None:
    fake = FakeEngine({"jailbreak": 0.4}, delay_s=0.05)
    async with CachedEngine(fake) as engine:
        results = await asyncio.gather(*(engine.decide("same", QUESTIONS) for _ in range(20)))
        assert engine.stats.shared == 19 and engine.stats.misses == 1
    assert len(fake.calls) == 1
    assert all(result.answers == results[0].answers for result in results)


async def test_errors_are_not_cached_and_reach_every_waiter() -> None:
    fake = FakeEngine(delay_s=0.02, error=EngineUnavailable("down"))
    async with CachedEngine(fake) as engine:
        outcomes = await asyncio.gather(*(engine.decide("x", QUESTIONS) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(outcome, EngineUnavailable) for outcome in outcomes)
        fake.error = None
        decided = await engine.decide("x", QUESTIONS)
    assert decided.cached is False
    assert len(fake.calls) == 2


async def test_a_cancelled_caller_does_not_cancel_the_shared_call() -> None:
    fake = FakeEngine(delay_s=0.05)
    async with CachedEngine(fake) as engine:
        leader = asyncio.create_task(engine.decide("x", QUESTIONS))
        follower = asyncio.create_task(engine.decide("x", QUESTIONS))
        await asyncio.sleep(0.01)
        leader.cancel()
        decided = await follower
        assert leader.cancelled()
        assert decided.cached is False
        assert (await engine.decide("x", QUESTIONS)).cached is True  # the call finished and filled the cache
    assert len(fake.calls) == 1


async def test_an_injected_engine_can_stay_open() -> None:
    fake = FakeEngine()
    async with CachedEngine(fake, owns_engine=False):
        pass
    assert not fake.closed


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries must be 0"):
        CachedEngine(FakeEngine(), max_entries=-1)


def test_key_is_stable_and_sensitive() -> None:
    base = cache_key("m", "state", QUESTIONS)
    assert base == cache_key("m", "state", dict(QUESTIONS))
    assert len(base) == 16
    variants = [
        cache_key("other", "state", QUESTIONS),
        cache_key("m", "state!", QUESTIONS),
        cache_key("m", ["state"], QUESTIONS),
        cache_key("m", "state", {"jailbreak": Noul("Jailbreak??"), "kind": QUESTIONS["kind"]}),
        cache_key("m", "state", {"jailbreak": Noul("Jailbreak?")}),
        cache_key("m", "state", {**QUESTIONS, "d": Score(None, ("a", "b"))}),
        cache_key("m", "state", QUESTIONS, images=["data:image/png;base64,AA=="]),
        cache_key("m", "state", QUESTIONS, videos=["data:image/png;base64,AA=="]),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert cache_key(None, {"b": 1, "a": 2}, QUESTIONS) == cache_key(None, {"a": 2, "b": 1}, QUESTIONS)


async def test_probe_goes_to_the_engine() -> None:
    async with CachedEngine(FakeEngine(model="fake-model")) as engine:
        assert (await engine.probe()).model == "fake-model"
        assert engine.model == "fake-model"
