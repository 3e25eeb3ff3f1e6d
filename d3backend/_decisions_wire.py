"""The OpenAI Decisions API's wire format (`POST /v1/decisions`), mapped to and from d3backend's questions and
answers (docs/decisions.md sets it beside SYSTEMONE.md's contract).

    >>> body = decisions_request("gpt-6-luna", "Fix my SQL", {"sql": Noul("Is this about SQL?")})
    >>> body["questions"]
    [{'type': 'predicate', 'name': 'sql', 'instructions': 'Is this about SQL?'}]

Questions: `noul` <-> `predicate` (its yes/no descriptions go into the instructions: a predicate has none),
`choice` <-> `choice` (each option a `{"value", "description"}`), `score` <-> `score` (each level a `{"label"}`).
Questions are a list there, named by `name`; here a mapping by id: the id is the name. A question without
instructions gets a default naming its id (a hosted model has no prompt of its own to fall back on, as d3 has).

Answers: a `predicate`'s `probability` is P(yes) (confidence: the likelier side's probability, as d3's); a
`choice`'s and a `score`'s `probabilities` are lists there, mappings (or level-ordered tuples) here. Every answer is
checked as `_wire.parse_response` checks d3's; a `refusal` is a question left unanswered: `EngineRefused`.

This module has no dependency on the `openai` SDK; tests/d3backend/test_decisions_contract.py validates what it
writes against the SDK's own parameter types and parses what it reads with the SDK's `Decision` model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from d3backend._errors import EngineBadAnswer, EngineBadResponse, EngineRefused
from d3backend._types import Answer, Choice, ChoiceAnswer, Noul, NoulAnswer, Question, ScoreAnswer, Usage
from d3backend._wire import ROUNDING, SUM_TOLERANCE, JSONValue

# Message roles the Decisions API takes as input items; a `tool` turn (its call id is not in the state) is a user
# message prefixed with its role.
MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
DECISIONS_MAX_QUESTIONS = 400
DECISIONS_MAX_CHOICES = 255


def default_instructions(qid: str, question: Question) -> str:
    """The instructions sent for a question that has none: its id says what it asks (`needs_code` -> "needs code")."""
    topic = qid.replace("_", " ")
    if isinstance(question, Noul):
        return f"Is this true of the input: {topic}?"
    if isinstance(question, Choice):
        return f"Which option fits the input best ({topic})?"
    return f"Rate the input on this scale: {topic}."


def question_param(qid: str, question: Question) -> dict[str, Any]:
    """One question as the Decisions API's `questions[]` item."""
    instructions = question.instructions or default_instructions(qid, question)
    if isinstance(question, Noul):
        meanings = [f"{side} means: {text}" for side, text in (("Yes", question.yes), ("No", question.no)) if text]
        text = "\n".join([instructions, *meanings])
        return {"type": "predicate", "name": qid, "instructions": text}
    if isinstance(question, Choice):
        choices = [
            {"value": name, **({"description": text} if text else {})} for name, text in question.options.items()
        ]
        return {"type": "choice", "name": qid, "instructions": instructions, "choices": choices}
    levels = [{"label": level} for level in question.levels]
    return {"type": "score", "name": qid, "instructions": instructions, "levels": levels}


def decision_input(state: JSONValue, images: Sequence[str] = ()) -> str | list[dict[str, Any]]:
    """The state as the Decisions API's `input`: text as text; a list of `{"role", "content"}` turns (the `json`
    state) as messages; other JSON as an `input_json` part (objects) or its text; images as `input_image` parts of
    the last user message (a new one when the last item is not a user's)."""
    items: list[dict[str, Any]]
    if _is_turns(state):
        items = [_message(turn["role"], turn["content"]) for turn in state]
    elif isinstance(state, str):
        if not images:
            return state
        items = [_message("user", state)]
    elif isinstance(state, dict) or (isinstance(state, list) and state and all(isinstance(v, dict) for v in state)):
        items = [{"type": "message", "role": "user", "content": [{"type": "input_json", "data": state}]}]
    else:
        text = json.dumps(state, ensure_ascii=False)
        if not images:
            return text
        items = [_message("user", text)]
    if images:
        if items and items[-1]["role"] == "user":
            last = items[-1]
        else:
            last = {"type": "message", "role": "user", "content": []}
            items.append(last)
        if isinstance(last["content"], str):
            last["content"] = [{"type": "input_text", "text": last["content"]}] if last["content"] else []
        last["content"].extend({"type": "input_image", "image_url": url} for url in images)
    return items


def _is_turns(state: JSONValue) -> bool:
    return (
        isinstance(state, list)
        and bool(state)
        and all(
            isinstance(turn, dict) and set(turn) == {"role", "content"} and isinstance(turn["role"], str)
            and isinstance(turn["content"], str)
            for turn in state
        )
    )  # fmt: skip


def _message(role: str, text: str) -> dict[str, Any]:
    if role in MESSAGE_ROLES:
        return {"type": "message", "role": role, "content": text}
    return {"type": "message", "role": "user", "content": f"{role}: {text}"}


def decisions_request(
    model: str,
    state: JSONValue,
    questions: Mapping[str, Question],
    images: Sequence[str] = (),
    prompt_cache_key: str | None = None,
) -> dict[str, Any]:
    """The body of one `POST /decisions` (as a dict: the caller writes it with `json_bytes`)."""
    body: dict[str, Any] = {
        "model": model,
        "input": decision_input(state, images),
        "questions": [question_param(qid, question) for qid, question in questions.items()],
    }
    if prompt_cache_key:
        body["prompt_cache_key"] = prompt_cache_key
    return body


# --- reading a Decision -------------------------------------------------------------------------------------------
class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Probability(_Lenient):
    probability: float
    value: str | bool | int | None = None
    label: str | None = None


class _Answer(_Lenient):
    type: str
    name: str | None = None
    probability: float | None = None  # predicate
    probabilities: list[_Probability] | None = None  # choice, score
    confidence: float | None = None
    choice: str | bool | None = None


class _Details(_Lenient):
    cached_tokens: int = 0


class _Usage(_Lenient):
    input_tokens: int = 0
    output_tokens: int = 0
    input_tokens_details: _Details = _Details()


class _Decision(_Lenient):
    model: str = ""
    answers: list[_Answer]
    usage: _Usage = _Usage()


def parse_decision(raw: bytes, questions: Mapping[str, Question]) -> tuple[dict[str, Answer], str, Usage]:
    """Read a 200 `Decision` into one answer per question (in the order asked, matched by position and name);
    raise `EngineRefused` naming the refused questions, `EngineBadResponse`/`EngineBadAnswer` for anything else
    that is not an answer to each question."""
    try:
        wire = _Decision.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EngineBadResponse(f"the engine's decision is malformed at {where or 'the top'}: {first['msg']}") from None
    if len(wire.answers) != len(questions):
        raise EngineBadResponse(
            f"the engine answered {len(wire.answers)} questions; {len(questions)} were asked (answers come in order)"
        )
    answers: dict[str, Answer] = {}
    refused: list[str] = []
    for (qid, question), got in zip(questions.items(), wire.answers, strict=True):
        if got.name is not None and got.name != qid:
            raise EngineBadAnswer(qid, "name", f"question {qid!r}: the engine's answer in its place is {got.name!r}")
        if got.type == "refusal":
            refused.append(qid)
            continue
        answers[qid] = _answer(qid, question, got)
    usage = wire.usage
    counted = Usage(usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens)
    if refused:
        raise EngineRefused(tuple(refused), answers, counted)
    return answers, wire.model, counted


_TYPES = {"noul": "predicate", "choice": "choice", "score": "score"}


def _answer(qid: str, question: Question, got: _Answer) -> Answer:
    expected = _TYPES[question.type]
    if got.type != expected:
        raise EngineBadAnswer(qid, "type", f"question {qid!r} is a {expected}, the engine answered a {got.type!r}")
    if isinstance(question, Noul):
        p = _unit(qid, "probability", got.probability)
        return NoulAnswer(p, max(p, 1.0 - p))
    keys = list(question.options) if isinstance(question, Choice) else list(question.levels)
    seen: dict[str, float] = {}
    for index, item in enumerate(got.probabilities or ()):
        if isinstance(question, Choice):
            key = item.value if isinstance(item.value, str) else None
        else:
            key = item.label if item.value == index and item.label in keys else None
        if key is None or key not in keys or key in seen:
            raise EngineBadAnswer(
                qid, f"probabilities.{index}", f"question {qid!r}: the engine's probability #{index} is for"
                f" {item.value if isinstance(question, Choice) else item.label!r}, not one of the options asked once",
            )  # fmt: skip
        seen[key] = _unit(qid, f"probabilities.{key}", item.probability)
    if set(seen) != set(keys):
        raise EngineBadAnswer(
            qid, "probabilities", f"question {qid!r}: the engine's probabilities are for {sorted(seen)},"
            f" expected {sorted(keys)}",
        )  # fmt: skip
    values = [seen[key] for key in keys]
    total = sum(values)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise EngineBadAnswer(
            qid, "probabilities", f"question {qid!r}: the engine's probabilities add up to {total:g}, not 1"
        )
    values = [p / total for p in values]
    confidence = _unit(qid, "confidence", got.confidence)
    if isinstance(question, Choice):
        probabilities = dict(zip(keys, values, strict=True))
        return ChoiceAnswer(max(keys, key=probabilities.__getitem__), probabilities, confidence)
    score = sum(index * p for index, p in enumerate(values))
    return ScoreAnswer(score, question.levels, tuple(values), confidence)


def _unit(qid: str, field: str, value: float | None) -> float:
    """A probability, checked, never defaulted (issue 19.9)."""
    if value is None:
        raise EngineBadAnswer(qid, field, f"question {qid!r}: the engine's answer has no {field}")
    if not 0.0 <= value <= 1.0 + ROUNDING:  # False for NaN too
        raise EngineBadAnswer(qid, field, f"question {qid!r}: the engine's {field} is {value!r}; expected 0 to 1")
    return min(value, 1.0)


# --- writing a Decision (the router's /v1/decisions, the test server) ---------------------------------------------
def answer_item(
    name: str | None, question: Question, answer: Answer | None, values: Sequence[Any] = ()
) -> dict[str, Any]:
    """One `answers[]` item of a `Decision`; `answer=None` is a refusal. `values` gives a choice's typed values
    (a client may ask with booleans), in the order of its options; by default the option names."""
    if answer is None:
        return {"type": "refusal", "name": name}
    if isinstance(answer, NoulAnswer):
        return {"type": "predicate", "name": name, "probability": answer.noul}
    if isinstance(answer, ChoiceAnswer):
        options = list(question.options) if isinstance(question, Choice) else list(answer.probabilities)
        typed = dict(zip(options, values or options, strict=True))
        probabilities = [{"value": typed[key], "probability": answer.probabilities[key]} for key in options]
        return {"type": "choice", "name": name, "choice": typed[answer.choice], "confidence": answer.confidence,
                "probabilities": probabilities}  # fmt: skip
    probabilities = [
        {"value": index, "label": label, "probability": p}
        for index, (label, p) in enumerate(zip(answer.legend, answer.probabilities, strict=True))
    ]
    return {"type": "score", "name": name, "score": answer.score, "confidence": answer.confidence,
            "probabilities": probabilities}  # fmt: skip


def usage_json(usage: Usage) -> dict[str, Any]:
    """A `Decision`'s `usage` (every field the SDK's model requires)."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }
