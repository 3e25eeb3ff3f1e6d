"""Issues 19.11 and 19.13: the answer cache is keyed by content, and the key's encoding is injective.

A library user's questions mapping is an ordinary dict: a policy rebuilt in the same mapping (or a mapping at an
address another one had) must never be answered from another policy's entries. And no two different decisions
(model, state, questions, images, videos) may share a key because of how their parts are joined.
"""

from __future__ import annotations

import pytest

from d3backend import CachedEngine, Choice, ChoiceAnswer, FakeEngine, Noul, NoulAnswer, Question, Score, cache_key

pytestmark = pytest.mark.anyio


async def test_a_mapping_rebuilt_in_place_is_not_answered_from_its_old_entries() -> None:
    fake = FakeEngine(lambda state, questions: {qid: 0.9 if "jail" in qid else 0.1 for qid in questions})
    questions: dict[str, Question] = {"jailbreak": Noul("Jailbreak?")}
    async with CachedEngine(fake) as engine:
        first = await engine.decide("hi", questions)
        questions.clear()
        questions["pii"] = Noul("Personal data?")  # the same dict object, another policy's questions
        second = await engine.decide("hi", questions)
    assert list(first.answers) == ["jailbreak"]
    assert list(second.answers) == ["pii"]
    assert second.cached is False
    assert len(fake.calls) == 2


async def test_a_question_replaced_in_place_is_asked_again() -> None:
    questions: dict[str, Question] = {"kind": Choice(None, {"code": None, "chat": None})}
    async with CachedEngine(FakeEngine({"kind": "code"})) as engine:
        await engine.decide("hi", questions)
        questions["kind"] = Choice(None, {"code": None, "chat": None, "math": None})
        decided = await engine.decide("hi", questions)
    assert decided.cached is False
    answer = decided.answers["kind"]
    assert isinstance(answer, ChoiceAnswer)
    assert set(answer.probabilities) == {"code", "chat", "math"}  # a rule reading kind.math finds it


async def test_options_changed_after_construction_do_not_change_the_question() -> None:
    options: dict[str, str | None] = {"code": None, "chat": None}
    kind = Choice(None, options)
    key = cache_key("m", "hi", {"kind": kind})
    options["math"] = None  # the caller's dict, not the question's
    assert list(kind.options) == ["code", "chat"]
    assert cache_key("m", "hi", {"kind": kind}) == key
    levels = ["easy", "hard"]
    score = Score(None, levels)  # type: ignore[arg-type]  # a list where a tuple is typed
    levels.append("expert")
    assert score.levels == ("easy", "hard")


async def test_equal_questions_in_different_mappings_share_entries() -> None:
    fake = FakeEngine({"jailbreak": 0.7})
    async with CachedEngine(fake) as engine:
        await engine.decide("hi", {"jailbreak": Noul("Jailbreak?")})
        again = await engine.decide("hi", {"jailbreak": Noul("Jailbreak?")})
    assert again.cached is True
    assert again.answers["jailbreak"] == NoulAnswer(0.7, 0.7)
    assert len(fake.calls) == 1


def test_questions_are_still_equal_values() -> None:
    assert Choice("x", {"a": None}) == Choice("x", {"a": None})
    assert Score(None, ("a", "b")) == Score(None, ("a", "b"))
    assert Noul("x", "y") != Noul("x", "z")


Q: dict[str, Question] = {"jailbreak": Noul("Jailbreak?")}


@pytest.mark.parametrize(
    ("one", "other"),
    [
        # 19.13: media joined with a separator that may appear inside a URL
        ({"images": ["a\0ib"]}, {"images": ["a", "b"]}),
        ({"images": ["x\0vy"]}, {"images": ["x"], "videos": ["y"]}),
        ({"images": ["a", "b"]}, {"images": ["ab"]}),
        ({"images": ["a"]}, {"videos": ["a"]}),
        ({"images": ["", ""]}, {"images": [""]}),
        # the other parts: a model or a state holding the separators
        ({"model": "a\0sb", "state": ""}, {"model": "a", "state": "b\0s"}),
        ({"model": "", "state": "x"}, {"model": None, "state": "x"}),
        ({"state": '"x"'}, {"state": ["x"]}),
        ({"state": "x"}, {"state": ["x"]}),
        ({"questions": {"a": Noul("b")}}, {"questions": {"a\0": Noul("b")}}),
        ({"questions": {"a": Noul(None), "b": Noul(None)}}, {"questions": {"b": Noul(None), "a": Noul(None)}}),
    ],
)
def test_different_decisions_never_share_a_key(one: dict[str, object], other: dict[str, object]) -> None:
    def key(parts: dict[str, object]) -> bytes:
        return cache_key(
            parts.get("model", "m"),  # type: ignore[arg-type]
            parts.get("state", "s"),
            parts.get("questions", Q),  # type: ignore[arg-type]
            images=parts.get("images", ()),  # type: ignore[arg-type]
            videos=parts.get("videos", ()),  # type: ignore[arg-type]
        )

    assert key(one) != key(other)


def test_the_key_is_stable_across_calls_and_objects() -> None:
    images = ["data:image/png;base64,AA==", "https://example.com/a.png"]
    first = cache_key("m", {"b": [1, 2], "a": "x"}, {"j": Noul("J?"), "k": Score(None, ("lo", "hi"))}, images)
    again = cache_key("m", {"a": "x", "b": [1, 2]}, {"j": Noul("J?"), "k": Score(None, ("lo", "hi"))}, list(images))
    assert first == again
    assert len(first) == 16
