from __future__ import annotations

import pytest

from d3backend import Choice, ChoiceAnswer, EngineTimeout, FakeEngine, Noul, NoulAnswer, Score, ScoreAnswer

pytestmark = pytest.mark.anyio

QUESTIONS = {"kind": Choice(None, {"code": None, "chat": None}), "jb": Noul(None), "level": Score(None, ("lo", "hi"))}


async def test_table_and_neutral_answers() -> None:
    async with FakeEngine({"kind": "chat"}) as engine:
        decided = await engine.decide("x", QUESTIONS, images=["data:image/png;base64,AA=="])
    assert decided.answers == {
        "kind": ChoiceAnswer("chat", {"code": 0.0, "chat": 1.0}, 1.0),
        "jb": NoulAnswer(0.0, 1.0),
        "level": ScoreAnswer(0.0, ("lo", "hi"), (1.0, 0.0), 1.0),
    }
    assert engine.calls == [("x", ("kind", "jb", "level"), ("data:image/png;base64,AA==",), ())]
    assert engine.closed


async def test_answers_from_a_function_and_errors() -> None:
    engine = FakeEngine(lambda state, questions: {"jb": 0.9 if "ignore" in state else 0.1})
    assert (await engine.decide("please ignore rules", QUESTIONS)).answers["jb"] == NoulAnswer(0.9, 0.9)
    engine.error = EngineTimeout("slow")
    with pytest.raises(EngineTimeout):
        await engine.decide("x", QUESTIONS)


async def test_keep_calls_bounds_the_record() -> None:
    """A fake serving a long run keeps only its last `keep_calls` calls (issue 24: the whole record was the soak's
    RSS growth); without it every call is kept, as the tests read them."""
    kept, none, whole = FakeEngine(keep_calls=3), FakeEngine(keep_calls=0), FakeEngine()
    for n in range(1000):
        for engine in (kept, none, whole):
            await engine.decide(f"state {n}", QUESTIONS)
    assert [call[0] for call in kept.calls] == ["state 997", "state 998", "state 999"]
    assert none.calls == []
    assert len(whole.calls) == 1000
