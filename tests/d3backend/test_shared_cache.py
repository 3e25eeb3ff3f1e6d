"""CachedEngine without entries (single-flight alone, issue 15.3) and with a shared second level (issue 12.4), and
the answers' text form a shared cache holds."""

from __future__ import annotations

import asyncio
import json

import pytest

from d3backend import (
    CachedEngine,
    Choice,
    Decided,
    FakeEngine,
    Noul,
    Question,
    Score,
    Usage,
    answer_from,
    decode_decided,
    encode_decided,
)

pytestmark = pytest.mark.anyio

QUESTIONS: dict[str, Question] = {
    "jailbreak": Noul("Jailbreak?"),
    "kind": Choice(None, {"code": None, "chat": None}),
    "difficulty": Score(None, ("easy", "medium", "hard")),
}
ANSWERS = {"jailbreak": 0.25, "kind": {"code": 0.7, "chat": 0.3}, "difficulty": 1.5}


class DictCache:
    """A shared cache in a dict, as two processes would see one Redis."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.ttls: dict[str, float] = {}
        self.gets = 0

    async def get(self, key: str) -> str | None:
        self.gets += 1
        return self.data.get(key)

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        self.data[key] = value
        self.ttls[key] = ttl_s


class BrokenCache:
    async def get(self, key: str) -> str | None:
        raise RuntimeError("broken shared cache")

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        raise RuntimeError("broken shared cache")


async def test_no_entries_still_shares_one_call_among_identical_decisions_in_flight() -> None:
    fake = FakeEngine(ANSWERS, delay_s=0.05)
    async with CachedEngine(fake, max_entries=0) as engine:
        results = await asyncio.gather(*(engine.decide("same", QUESTIONS) for _ in range(10)))
        assert len(fake.calls) == 1 and engine.stats.shared == 9
        assert all(result.answers == results[0].answers for result in results)
        again = await engine.decide("same", QUESTIONS)  # nothing kept: the next one asks the engine again
        assert again.cached is False and engine.stats.size == 0 and engine.stats.hits == 0
    assert len(fake.calls) == 2


async def test_a_second_process_is_answered_by_the_shared_cache() -> None:
    shared = DictCache()
    first_engine, second_engine = FakeEngine(ANSWERS), FakeEngine(ANSWERS)
    async with CachedEngine(first_engine, shared=shared, ttl_s=30) as first:
        decided = await first.decide("a state", QUESTIONS)
    assert decided.cached is False and len(first_engine.calls) == 1
    assert list(shared.ttls.values()) == [30]  # written (the close waited for the background write), with the TTL
    async with CachedEngine(second_engine, shared=shared) as second:
        found = await second.decide("a state", QUESTIONS)
        assert found.cached is True and found.answers == decided.answers and found.model == decided.model
        assert second.stats.shared_hits == 1 and second.stats.misses == 1
        assert (await second.decide("a state", QUESTIONS)).cached is True  # now from its own memory
        assert shared.gets == 2  # the first process's miss, the second's hit; not the in-memory hit
    assert second_engine.calls == []


async def test_the_shared_cache_holds_digests_and_answers_not_the_state() -> None:
    shared = DictCache()
    async with CachedEngine(FakeEngine(ANSWERS), shared=shared) as engine:
        await engine.decide("my secret prompt", QUESTIONS)
    [(key, value)] = shared.data.items()
    assert len(key) == 32 and int(key, 16) >= 0
    assert "secret" not in value and set(json.loads(value)["a"]) == set(QUESTIONS)


async def test_a_broken_shared_cache_fails_no_call() -> None:
    fake = FakeEngine(ANSWERS)
    async with CachedEngine(fake, shared=BrokenCache()) as engine:
        decided = await engine.decide("x", QUESTIONS)
    assert decided.answers["kind"].choice == "code" and len(fake.calls) == 1  # type: ignore[union-attr]


def decided_for(questions: dict[str, Question]) -> Decided:
    answers = {qid: answer_from(question, ANSWERS[qid]) for qid, question in questions.items()}
    return Decided(answers, "d3-tiny", Usage(12, 0))


def test_answers_read_back_as_written() -> None:
    decided = decided_for(QUESTIONS)
    back = decode_decided(encode_decided(decided), QUESTIONS)
    assert back == decided


@pytest.mark.parametrize(
    "change",
    [
        lambda data: "not json",
        lambda data: json.dumps([1, 2]),
        lambda data: json.dumps({**data, "a": {k: v for k, v in data["a"].items() if k != "kind"}}),
        lambda data: json.dumps({**data, "a": {**data["a"], "extra": ["n", 0.5, 0.5]}}),
        lambda data: json.dumps({**data, "a": {**data["a"], "jailbreak": ["n", 1.5, 0.5]}}),
        lambda data: json.dumps({**data, "a": {**data["a"], "jailbreak": ["c", "x", {}, 0.5]}}),
        lambda data: json.dumps({**data, "a": {**data["a"], "kind": ["c", "code", {"code": 0.5, "other": 0.5}, 0.5]}}),
        lambda data: json.dumps({**data, "a": {**data["a"], "difficulty": ["s", 1.0, ["a", "b", "c"], [0, 1, 0], 1]}}),
        lambda data: json.dumps(
            {**data, "a": {**data["a"], "difficulty": ["s", "1", ["easy", "medium", "hard"], [0, 1, 0], 1]}}
        ),
        lambda data: json.dumps({**data, "m": 7}),
        lambda data: json.dumps({**data, "u": [1]}),
    ],
)
def test_an_entry_that_does_not_answer_these_questions_is_a_miss(change: object) -> None:
    data = json.loads(encode_decided(decided_for(QUESTIONS)))
    assert decode_decided(change(data), QUESTIONS) is None  # type: ignore[operator]


async def test_a_corrupted_shared_entry_is_asked_of_the_engine() -> None:
    shared = DictCache()
    async with CachedEngine(FakeEngine(ANSWERS), shared=shared) as engine:
        await engine.decide("x", QUESTIONS)
    [key] = shared.data
    shared.data[key] = "garbage"
    fake = FakeEngine(ANSWERS)
    async with CachedEngine(fake, shared=shared) as engine:
        assert (await engine.decide("x", QUESTIONS)).cached is False
    assert len(fake.calls) == 1 and shared.data[key] != "garbage"  # and the good answer is written back
