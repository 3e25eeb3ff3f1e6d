"""Requests exactly as SYSTEMONE.md; responses read strictly where it matters and tolerantly elsewhere."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from d3backend import Choice, ChoiceAnswer, EngineBadResponse, Noul, NoulAnswer, Question, Score, ScoreAnswer, Usage
from d3backend._wire import error_message, parse_response, request_body

QUESTIONS: dict[str, Question] = {
    "kind": Choice("What kind?", {"code": "Writing code", "chat": None}),
    "jailbreak": Noul("Jailbreak?"),
    "pii": Noul(None, yes="names a person", no=None),
    "difficulty": Score("How hard?", ("easy", "hard", "expert")),
}


def response(**answers: Any) -> dict[str, Any]:
    base = {
        "kind": {"type": "choice", "choice": "code", "probabilities": {"code": 0.9, "chat": 0.1}, "confidence": 0.9},
        "jailbreak": {"type": "noul", "noul": 0.2, "probabilities": {"yes": 0.2, "no": 0.8}, "confidence": 0.8},
        "pii": {"type": "noul", "noul": 0.7, "probabilities": {"yes": 0.7, "no": 0.3}, "confidence": 0.7},
        "difficulty": {
            "type": "score", "score": 1.1, "legend": {"0": "easy", "1": "hard", "2": "expert"},
            "probabilities": {"0": 0.2, "1": 0.5, "2": 0.3}, "confidence": 0.5,
        },
    }  # fmt: skip
    base.update(answers)
    return {
        "id": "decision-1", "object": "structured_decision", "created": 1764400000, "model": "vllm-sr/d3-mini",
        "answers": {k: v for k, v in base.items() if v is not None},
        "usage": {"input_tokens": 812, "output_tokens": 0},
        "diagnostics": {"kind": {"label_mass": 1.0, "argmax_is_label": True}},
        "joint": None,
    }  # fmt: skip


def test_request_body_is_exactly_the_wire_format() -> None:
    body = json.loads(request_body("vllm-sr/d3-mini", "Fix my code", QUESTIONS))
    assert body == {
        "model": "vllm-sr/d3-mini",
        "state": "Fix my code",
        "questions": {
            "kind": {
                "type": "choice",
                "instructions": "What kind?",
                "criteria": {"code": "Writing code", "chat": None},
            },
            "jailbreak": {"type": "noul", "instructions": "Jailbreak?"},
            "pii": {"type": "noul", "instructions": None, "criteria": {"true": "names a person", "false": None}},
            "difficulty": {"type": "score", "instructions": "How hard?", "criteria": ["easy", "hard", "expert"]},
        },
    }
    assert "instructions" not in body  # d3 refuses a top-level instructions field


def test_request_body_keeps_question_order_json_state_and_media() -> None:
    state = {"messages": [{"role": "user", "content": "héllo"}]}
    raw = request_body(
        "m",
        state,
        {"b": Noul(None), "a": Noul(None)},
        images=["data:image/png;base64,AA=="],
        videos=["data:video/mp4;base64,AA=="],
    )
    body = json.loads(raw)
    assert list(body["questions"]) == ["b", "a"]
    assert body["state"] == state
    assert "héllo".encode() in raw  # not escaped, as the engine renders it
    assert body["images"] == ["data:image/png;base64,AA=="]
    assert body["videos"] == ["data:video/mp4;base64,AA=="]
    assert set(body) == {"model", "state", "questions", "images", "videos"}


def test_request_body_with_255_options() -> None:
    options = {f"option-{i}": None for i in range(255)}
    body = json.loads(request_body("vllm-sr/d3-mini", "x", {"big": Choice(None, options)}))
    assert list(body["questions"]["big"]["criteria"]) == list(options)


def test_parse_a_d3_response() -> None:
    answers, model, usage = parse_response(json.dumps(response()).encode(), QUESTIONS)
    assert model == "vllm-sr/d3-mini"
    assert usage == Usage(812, 0)
    assert answers["kind"] == ChoiceAnswer("code", {"code": 0.9, "chat": 0.1}, 0.9)
    assert answers["jailbreak"] == NoulAnswer(0.2, 0.8)
    assert answers["jailbreak"].probabilities == {"yes": 0.2, "no": 0.8}
    difficulty = answers["difficulty"]
    assert isinstance(difficulty, ScoreAnswer)
    assert difficulty.legend == ("easy", "hard", "expert")
    assert difficulty.probabilities == (0.2, 0.5, 0.3)
    assert difficulty.score == pytest.approx(1.1)


def test_parse_tolerates_extra_fields_and_answers_not_asked() -> None:
    body = response(extra={"type": "noul", "probabilities": {"yes": 1, "no": 0}})
    body["answers"]["kind"]["new_field"] = [1, 2]
    body["something_new"] = {"x": 1}
    answers, _, _ = parse_response(json.dumps(body).encode(), QUESTIONS)
    assert list(answers) == list(QUESTIONS)


def test_rounded_probabilities_are_renormalized() -> None:
    kind_answer = {
        "type": "choice",
        "choice": "code",
        "probabilities": {"code": 0.9004, "chat": 0.1},
        "confidence": 0.9,
    }
    answers, _, _ = parse_response(json.dumps(response(kind=kind_answer)).encode(), QUESTIONS)
    kind = answers["kind"]
    assert isinstance(kind, ChoiceAnswer)
    assert sum(kind.probabilities.values()) == pytest.approx(1.0, abs=1e-12)
    assert kind.confidence == 0.9  # as sent: only the probabilities are renormalized


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "the engine's answer is malformed at the top: Invalid JSON"),
        (b"[]", "the engine's answer is malformed at the top: Input should be an object"),
        (json.dumps({"answers": {}}).encode(), "the engine did not answer question 'kind'"),
        (json.dumps(response(pii=None)).encode(), "the engine did not answer question 'pii'"),
        (
            json.dumps(response(kind={"type": "noul", "probabilities": {"yes": 1, "no": 0}})).encode(),
            "question 'kind' is a choice, the engine answered a 'noul'",
        ),
        (
            json.dumps(response(kind={"type": "choice", "probabilities": {"code": 1.0}})).encode(),
            "question 'kind': the engine's probabilities are for ['code'], expected ['chat', 'code']",
        ),
        (
            json.dumps(response(kind={"type": "choice", "probabilities": {"code": 0.7, "chat": 0.1}})).encode(),
            "question 'kind': the engine's probabilities add up to 0.8, not 1",
        ),
        (
            json.dumps(response(kind={"type": "choice", "probabilities": {"code": 1.5, "chat": -0.5}})).encode(),
            "question 'kind': the engine's probability of 'code' is 1.5; expected a number from 0 to 1",
        ),
        (
            b'{"answers": {"kind": {"type": "choice", "probabilities": {"code": NaN, "chat": 0.5}}}}',
            "question 'kind': the engine's probability of 'code' is nan; expected a number from 0 to 1",
        ),
        (
            json.dumps(response(kind={"type": "choice", "probabilities": {"code": "high", "chat": 0.1}})).encode(),
            "the engine's answer is malformed at answers.kind.probabilities.code: Input should be a valid number",
        ),
    ],
)
def test_bad_responses(body: bytes, message: str) -> None:
    with pytest.raises(EngineBadResponse, match=f"^{re.escape(message)}"):
        parse_response(body, QUESTIONS)


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (
            400,
            b'{"error": {"message": "instructions are not supported by this model", "type": "BadRequestError", "param": null, "code": 400}}',
            "instructions are not supported by this model",
        ),
        (
            400,
            b'{"error": {"message": "1 validation error", "type": "Bad Request", "param": "body.joint_x", "code": 400}}',
            "1 validation error",
        ),
        (
            422,
            b'{"detail": [{"loc": ["body", "state"], "msg": "Field required"}]}',
            '[{"loc": ["body", "state"], "msg": "Field required"}]',
        ),
        (529, b'{"detail": {"message": "overloaded, retry later"}}', "overloaded, retry later"),
        (503, b'{"detail": "Service Unavailable"}', "Service Unavailable"),
        (500, b'{"message": "boom"}', "boom"),
        (502, b'{"error": "bad gateway"}', "bad gateway"),
        (502, b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
        (500, b"", "HTTP 500 with an empty body"),
        (500, b"x" * 1000, "x" * 497 + "..."),
    ],
)
def test_error_messages_of_other_servers(status: int, body: bytes, message: str) -> None:
    assert error_message(status, body) == message


def test_a_lone_surrogate_in_the_state_is_sent_escaped() -> None:
    raw = request_body("m", "a\ud800b é", {"q": Noul(None)})
    assert b"\\ud800" in raw
    assert json.loads(raw)["state"] == "a\ud800b é"
    assert "é".encode() not in raw  # the fallback escapes everything, which is still the same JSON
    assert "é".encode() in request_body("m", "b é", {"q": Noul(None)})
