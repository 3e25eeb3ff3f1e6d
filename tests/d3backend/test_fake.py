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
