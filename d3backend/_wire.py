"""The `/v1/systemone` wire format: building requests and reading responses and errors (see SYSTEMONE.md).

Requests carry only the fields every server accepts: vLLM 0.33 refuses unknown top-level fields, and d3 models
refuse a non-empty top-level `instructions`, so neither is ever sent. Responses are read strictly where it
matters (every question answered, with its type and its options) and tolerantly elsewhere (extra fields are
ignored, and probabilities that drift from 1.0 by rounding are renormalized).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from d3backend._errors import EngineBadAnswer, EngineBadResponse
from d3backend._types import (
    Answer,
    Choice,
    ChoiceAnswer,
    Noul,
    NoulAnswer,
    Question,
    ScoreAnswer,
    Usage,
)

JSONValue = Any  # str, number, bool, None, list or dict of them
# Probabilities may drift this far from summing to 1 (servers that round) before an answer is refused.
SUM_TOLERANCE = 1e-3
# A single probability or confidence may exceed 1 by this much: vLLM's confidence is a probability times the
# labels' summed mass, which float rounding can put a hair above 1. It is then read as 1.
ROUNDING = 1e-6
MAX_ERROR_MESSAGE = 500


def request_body(
    model: str,
    state: JSONValue,
    questions: Mapping[str, Question],
    images: Sequence[str] = (),
    videos: Sequence[str] = (),
) -> bytes:
    """The JSON body of one decision request."""
    body: dict[str, Any] = {
        "model": model,
        "state": state,
        "questions": {qid: question.to_wire() for qid, question in questions.items()},
    }
    if images:
        body["images"] = list(images)
    if videos:
        body["videos"] = list(videos)
    return json_bytes(body)


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON. Text that cannot be UTF-8 (a lone surrogate, which JSON input may carry as \\ud800)
    is written escaped instead, so it still reaches the other side as the same JSON string."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _WireAnswer(_Lenient):
    type: str
    probabilities: dict[str, float]
    confidence: float | None = None  # required by the contract; checked in `_answer` to name the question


class _WireUsage(_Lenient):
    input_tokens: int = 0
    output_tokens: int = 0


class _WireResponse(_Lenient):
    model: str = ""
    answers: dict[str, _WireAnswer]
    usage: _WireUsage = _WireUsage()


def parse_response(raw: bytes, questions: Mapping[str, Question]) -> tuple[dict[str, Answer], str, Usage]:
    """Read a 200 body into one answer per question; raise `EngineBadResponse` naming what is wrong."""
    try:
        wire = _WireResponse.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EngineBadResponse(f"the engine's answer is malformed at {where or 'the top'}: {first['msg']}") from None
    answers: dict[str, Answer] = {}
    for qid, question in questions.items():
        got = wire.answers.get(qid)
        if got is None:
            raise EngineBadAnswer(qid, "", f"the engine did not answer question {qid!r}")
        if got.type != question.type:
            raise EngineBadAnswer(
                qid, "type", f"question {qid!r} is a {question.type}, the engine answered a {got.type!r}"
            )
        answers[qid] = _answer(qid, question, got)
    return answers, wire.model, Usage(wire.usage.input_tokens, wire.usage.output_tokens)


def _answer(qid: str, question: Question, got: _WireAnswer) -> Answer:
    if isinstance(question, Choice):
        keys = list(question.options)
    elif isinstance(question, Noul):
        keys = ["yes", "no"]
    else:
        keys = [str(index) for index in range(len(question.levels))]
    # Every number is checked, never defaulted: a guard reading a missing or NaN value as 0.0 would let the
    # request through on an answer nobody gave (issue 19.9).
    if set(got.probabilities) != set(keys):
        raise EngineBadAnswer(
            qid,
            "probabilities",
            f"question {qid!r}: the engine's probabilities are for {sorted(got.probabilities)},"
            f" expected {sorted(keys)}",
        )
    values = [got.probabilities[key] for key in keys]
    for key, p in zip(keys, values, strict=True):
        if not _unit(p):
            raise EngineBadAnswer(
                qid, f"probabilities.{key}", f"question {qid!r}: the engine's probability of {key!r} {_outside(p)}"
            )
    total = sum(values)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise EngineBadAnswer(
            qid, "probabilities", f"question {qid!r}: the engine's probabilities add up to {total:g}, not 1"
        )
    values = [p / total for p in values]  # rounding drift within SUM_TOLERANCE (SYSTEMONE.md)
    confidence = got.confidence
    if confidence is None:
        raise EngineBadAnswer(qid, "confidence", f"question {qid!r}: the engine's answer has no confidence")
    if not _unit(confidence):
        raise EngineBadAnswer(qid, "confidence", f"question {qid!r}: the engine's confidence {_outside(confidence)}")
    confidence = min(confidence, 1.0)
    if isinstance(question, Choice):
        probabilities = dict(zip(keys, values, strict=True))
        return ChoiceAnswer(max(keys, key=probabilities.__getitem__), probabilities, confidence)
    if isinstance(question, Noul):
        return NoulAnswer(values[0], confidence)
    score = sum(index * p for index, p in enumerate(values))
    return ScoreAnswer(score, question.levels, tuple(values), confidence)


def _unit(value: float) -> bool:
    return 0.0 <= value <= 1.0 + ROUNDING  # False for NaN too


def _outside(value: float) -> str:
    return f"is {value!r}; expected a number from 0 to 1"


def error_message(status: int, raw: bytes) -> str:
    """The explanation in an error body, whatever the server's shape: OpenAI's `{"error": {"message"}}`,
    FastAPI's `{"detail": ...}`, a bare `{"message"}`, or text."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    message: Any = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        if message is None and "detail" in body:
            detail = body["detail"]
            message = detail.get("message", detail) if isinstance(detail, dict) else detail
        if message is None:
            message = body.get("message")
    if message is None:
        message = text or f"HTTP {status} with an empty body"
    text = message if isinstance(message, str) else json.dumps(message, ensure_ascii=False)
    return text if len(message) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 3] + "..."


def answer_wire(answer: Answer) -> dict[str, Any]:
    """One answer as a `/v1/systemone` response writes it (SYSTEMONE.md): what the router's own `/v1/systemone`
    serves, and what `parse_response` reads back to the same answer."""
    if isinstance(answer, ChoiceAnswer):
        return {"type": "choice", "choice": answer.choice, "probabilities": dict(answer.probabilities),
                "confidence": answer.confidence}  # fmt: skip
    if isinstance(answer, NoulAnswer):
        return {"type": "noul", "noul": answer.noul, "probabilities": dict(answer.probabilities),
                "confidence": answer.confidence}  # fmt: skip
    return {
        "type": "score",
        "score": answer.score,
        "legend": {str(index): label for index, label in enumerate(answer.legend)},
        "probabilities": {str(index): p for index, p in enumerate(answer.probabilities)},
        "confidence": answer.confidence,
    }
