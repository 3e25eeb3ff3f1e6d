"""Answers, the engine's wire and compact JSON at their edges: probabilities of exactly 0 and 1, the pick by
probability, every usage count, error bodies that are not UTF-8 or not strings. Each test kills mutants mutmut
found surviving (benchmarks/results/mutation.md)."""

from __future__ import annotations

import json
import math

import pytest

from d3backend import (
    Answer,
    Choice,
    ChoiceAnswer,
    EngineBadAnswer,
    EngineBadResponse,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    Usage,
    answer_from,
    json_bytes,
)
from d3backend._wire import MAX_ERROR_MESSAGE, ROUNDING, answer_wire, error_message, parse_response
from tests.d3backend.test_wire import QUESTIONS, response


def test_a_boolean_noul_answer_is_certain_either_way() -> None:
    assert answer_from(Noul(None), True).noul == 1.0
    assert answer_from(Noul(None), False).noul == 0.0


def test_a_mapping_may_give_an_option_probability_zero() -> None:
    answer = answer_from(Choice(None, {"a": None, "b": None}), {"a": 0.0, "b": 1.0})
    assert (answer.choice, answer.probabilities) == ("b", {"a": 0.0, "b": 1.0})


def test_the_engines_pick_is_the_most_probable_option_not_the_last_name() -> None:
    questions: dict[str, Question] = {"kind": Choice(None, {"code": None, "chat": None})}
    body = response(kind={"type": "choice", "choice": "chat", "probabilities": {"code": 0.2, "chat": 0.8},
                          "confidence": 0.8})  # fmt: skip
    answers, _, _ = parse_response(json.dumps(body).encode(), questions)
    assert answers["kind"].choice == "chat"  # type: ignore[union-attr]  # "code" is the greater name


def test_probabilities_of_exactly_zero_and_one_are_valid_and_usage_is_read_whole() -> None:
    body = response(
        jailbreak={"type": "noul", "noul": 1.0, "probabilities": {"yes": 1.0, "no": 0.0}, "confidence": 1.0},
        difficulty={"type": "score", "score": 0.0, "probabilities": {"0": 1.0, "1": 0.0, "2": 0.0}, "confidence": 0.9},
    )
    body["usage"] = {"input_tokens": 812, "output_tokens": 3}
    answers, _, usage = parse_response(json.dumps(body).encode(), QUESTIONS)
    assert answers["jailbreak"].noul == 1.0  # type: ignore[union-attr]
    assert answers["difficulty"].confidence == 0.9
    assert answers["difficulty"].probabilities == (1.0, 0.0, 0.0)  # type: ignore[union-attr]
    assert usage == Usage(812, 3)


def test_a_probability_above_one_is_out_of_range_before_the_sum_is_checked() -> None:
    body = response(jailbreak={"type": "noul", "noul": 1.5, "probabilities": {"yes": 1.5, "no": 0.0},
                               "confidence": 0.8})  # fmt: skip
    with pytest.raises(
        EngineBadResponse, match=r"the engine's probability of 'yes' is 1.5; expected a number from 0 to 1"
    ):
        parse_response(json.dumps(body).encode(), QUESTIONS)


def test_score_questions_keep_their_levels() -> None:
    questions: dict[str, Question] = {"d": Score(None, ("a", "b"))}
    body = response(d={"type": "score", "score": 0.5, "probabilities": {"0": 0.5, "1": 0.5}, "confidence": 0.5})
    answers, _, _ = parse_response(json.dumps(body).encode(), questions)
    assert answers["d"].legend == ("a", "b")  # type: ignore[union-attr]


def test_json_bytes_is_compact_utf8_and_escapes_only_what_utf8_cannot_carry() -> None:
    assert json_bytes({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'.encode()
    assert json_bytes({"a": "\ud800", "b": [1, 2]}) == b'{"a":"\\ud800","b":[1,2]}'


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\xffbad gateway", "\ufffdbad gateway"),  # not UTF-8: read with replacement, never an exception
        (b'{"detail": {"code": 7}}', '{"code": 7}'),  # a detail without a message: the detail itself
        (b'{"message": ["caf\xc3\xa9"]}', '["café"]'),  # a message that is not a string: its JSON, unescaped
    ],
)
def test_error_messages_whatever_the_body(raw: bytes, expected: str) -> None:
    assert error_message(502, raw) == expected


def test_an_error_message_of_exactly_the_limit_is_kept_whole() -> None:
    text = "x" * MAX_ERROR_MESSAGE
    assert error_message(500, text.encode()) == text
    assert error_message(500, (text + "y").encode()) == "x" * (MAX_ERROR_MESSAGE - 3) + "..."


# --- `answer_from` at its tolerance: a total a hair over 1 is accepted (rounding in a hand-written table) and the
# options left out get 0, never a negative probability.

THREE = Choice(None, {"a": None, "b": None, "c": None})


def test_a_total_a_hair_over_one_leaves_the_other_options_at_zero_not_below() -> None:
    answer = answer_from(THREE, {"a": 0.5, "b": 0.5000005})
    assert isinstance(answer, ChoiceAnswer)
    assert answer.probabilities == {"a": 0.5, "b": 0.5000005, "c": 0.0}
    assert answer.choice == "b"


def test_a_score_level_left_out_of_a_total_over_one_is_zero_too() -> None:
    answer = answer_from(Score(None, ("easy", "medium", "hard")), {"easy": 0.4, "hard": 0.6000004})
    assert isinstance(answer, ScoreAnswer)
    assert answer.probabilities == (0.4, 0.0, 0.6000004)


def test_a_total_of_exactly_one_plus_the_tolerance_is_accepted_and_a_hair_more_is_not() -> None:
    assert answer_from(THREE, {"a": 1.0, "b": 1e-6}).probabilities == {"a": 1.0, "b": 1e-6, "c": 0.0}
    with pytest.raises(ValueError, match="add up to 1"):
        answer_from(THREE, {"a": 1.0, "b": 1.1e-6})


# --- The engine's answers at the contract's exact edge: 1 + ROUNDING is still a probability (read as 1), the next
# representable number is not.

EDGE = 1.0 + ROUNDING
PAST = math.nextafter(EDGE, 2.0)


def noul(yes: float, confidence: float) -> bytes:
    return (
        b'{"model": "m", "answers": {"j": {"type": "noul", "probabilities": {"yes": %r, "no": 0.0}, "confidence": %r}}}'
        % (yes, confidence)
    )


def test_one_plus_the_rounding_allowance_is_accepted_as_one() -> None:
    answers, _, _ = parse_response(noul(EDGE, EDGE), {"j": Noul(None)})
    assert answers["j"].confidence == 1.0
    assert answers["j"].probabilities == {"yes": 1.0, "no": 0.0}


@pytest.mark.parametrize(("yes", "confidence", "field"), [(PAST, 1.0, "probabilities.yes"), (1.0, PAST, "confidence")])
def test_the_next_number_past_the_allowance_is_an_engine_error(yes: float, confidence: float, field: str) -> None:
    with pytest.raises(EngineBadAnswer) as caught:
        parse_response(noul(yes, confidence), {"j": Noul(None)})
    assert caught.value.field == field


# --- `answer_wire`: what the router's own /v1/systemone serves (SYSTEMONE.md), read back by `parse_response`.

WIRE_ANSWERS: dict[str, Answer] = {
    "kind": ChoiceAnswer("code", {"code": 0.75, "chat": 0.25}, 0.5),
    "jailbreak": NoulAnswer(0.25, 0.5),
    "difficulty": ScoreAnswer(1.25, ("easy", "hard", "expert"), (0.25, 0.25, 0.5), 0.5),
}


def test_answer_wire_writes_each_kind_of_answer_as_the_wire_format() -> None:
    assert {qid: answer_wire(answer) for qid, answer in WIRE_ANSWERS.items()} == {
        "kind": {"type": "choice", "choice": "code", "probabilities": {"code": 0.75, "chat": 0.25}, "confidence": 0.5},
        "jailbreak": {"type": "noul", "noul": 0.25, "probabilities": {"yes": 0.25, "no": 0.75}, "confidence": 0.5},
        "difficulty": {
            "type": "score", "score": 1.25, "legend": {"0": "easy", "1": "hard", "2": "expert"},
            "probabilities": {"0": 0.25, "1": 0.25, "2": 0.5}, "confidence": 0.5,
        },
    }  # fmt: skip


def test_answer_wire_is_read_back_to_the_same_answers() -> None:
    questions = {qid: QUESTIONS[qid] for qid in WIRE_ANSWERS}
    body = {"model": "m", "answers": {qid: answer_wire(answer) for qid, answer in WIRE_ANSWERS.items()}}
    answers, _, _ = parse_response(json.dumps(body).encode(), questions)
    assert answers == WIRE_ANSWERS
