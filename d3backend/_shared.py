"""A second-level decision cache shared by processes: the protocol `CachedEngine` talks to, and the answers'
text form.

    engine = CachedEngine(inner, shared=redis_answers)   # d3router's Redis (router/_sessions/store.py) implements it

A shared cache maps a decision's content digest (hex) to its answers as compact JSON; it holds no request text.
An entry that does not read back as answers to the questions asked is a miss, never an error: another process,
another version or a corrupted value must not fail a request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Protocol

from d3backend._types import Answer, Choice, ChoiceAnswer, Decided, Noul, NoulAnswer, Question, ScoreAnswer, Usage


class SharedCache(Protocol):
    """Text keys (digests) to text values, each with a TTL; slow or down, it answers None and drops writes."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, ttl_s: float) -> None: ...


def encode_decided(decided: Decided) -> str:
    """The answers (and the model and usage) as compact JSON: `{"m": model, "u": [in, out], "a": {...}}`, and
    `"e"`: the pool's engine that answered, when one did."""
    answers: dict[str, list[Any]] = {}
    for qid, answer in decided.answers.items():
        if isinstance(answer, ChoiceAnswer):
            answers[qid] = ["c", answer.choice, dict(answer.probabilities), answer.confidence]
        elif isinstance(answer, NoulAnswer):
            answers[qid] = ["n", answer.noul, answer.confidence]
        else:
            answers[qid] = ["s", answer.score, list(answer.legend), list(answer.probabilities), answer.confidence]
    usage = [decided.usage.input_tokens, decided.usage.output_tokens]
    data: dict[str, Any] = {"m": decided.model, "u": usage, "a": answers}
    if decided.engine:  # the pool's engine that answered: the log names it on a shared hit too
        data["e"] = decided.engine
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def decode_decided(text: str, questions: Mapping[str, Question]) -> Decided | None:
    """The answers `text` holds, or None when it is not a well-formed answer to each of `questions`."""
    try:
        data = json.loads(text)
        model, (tokens_in, tokens_out), raw = data["m"], data["u"], data["a"]
        if not isinstance(model, str) or not isinstance(raw, dict) or list(raw) != list(questions):
            return None
        engine = data.get("e", "")
        if not isinstance(engine, str):
            return None
        answers = {qid: _answer(question, raw[qid]) for qid, question in questions.items()}
        return Decided(answers, model, Usage(int(tokens_in), int(tokens_out)), engine=engine)
    except (ValueError, TypeError, KeyError, IndexError):  # json's errors are ValueErrors
        return None


def _answer(question: Question, raw: Any) -> Answer:
    if raw[0] != question.type[0]:
        raise ValueError("an answer of another type")
    if isinstance(question, Choice):
        _, choice, probs, confidence = raw
        if not isinstance(probs, dict) or list(probs) != list(question.options) or choice not in probs:
            raise ValueError("another question's options")
        return ChoiceAnswer(choice, {k: _p(v) for k, v in probs.items()}, _p(confidence))
    if isinstance(question, Noul):
        _, noul, confidence = raw
        return NoulAnswer(_p(noul), _p(confidence))
    _, score, legend, probs, confidence = raw
    if tuple(legend) != question.levels or len(probs) != len(legend):
        raise ValueError("another question's levels")
    return ScoreAnswer(_number(score), question.levels, tuple(_p(v) for v in probs), _p(confidence))


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("not a number")
    return float(value)


def _p(value: Any) -> float:
    number = _number(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("not a probability")
    return number
