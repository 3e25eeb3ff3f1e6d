"""Answers from a short description, for fakes, tests and policy test cases.

    >>> answer_from(Noul("Jailbreak?"), 0.97).noul
    0.97
    >>> answer_from(Score(None, ("easy", "hard")), 0.25).probabilities
    (0.75, 0.25)

A noul takes P(yes); a choice an option name or a mapping of option probabilities; a score its expected level (a
number, split between the two nearest levels), a level name, or a mapping of level probabilities. Options a mapping
leaves out share what is left of 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from d3backend._types import Answer, Choice, ChoiceAnswer, Noul, NoulAnswer, Question, ScoreAnswer

_TOLERANCE = 1e-6


def answer_from(question: Question, value: Any) -> Answer:
    """The answer `value` describes for `question`; raise `ValueError` naming what was expected."""
    if isinstance(question, Noul):
        if isinstance(value, bool):
            value = 1.0 if value else 0.0
        if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise ValueError(f"a noul's answer is P(yes), a number from 0 to 1; found {value!r}")
        return NoulAnswer(float(value), max(value, 1.0 - value))
    if isinstance(question, Choice):
        probs = _distribution(list(question.options), value, "option")
        pick = max(probs, key=probs.__getitem__)
        return ChoiceAnswer(pick, probs, probs[pick])
    levels = list(question.levels)
    if isinstance(value, int | float) and not isinstance(value, bool):
        top = len(levels) - 1
        if not 0.0 <= value <= top:
            raise ValueError(f"a score's answer is its expected level, a number from 0 to {top}; found {value!r}")
        low = math.floor(value)
        probs = dict.fromkeys(levels, 0.0)
        probs[levels[low]] = 1.0 - (value - low)
        if low < top:
            probs[levels[low + 1]] = value - low
    else:
        probs = _distribution(levels, value, "level")
    values = tuple(probs[level] for level in levels)
    best = max(range(len(levels)), key=values.__getitem__)
    score = sum(index * p for index, p in enumerate(values))
    return ScoreAnswer(score, tuple(levels), values, values[best])


def _distribution(names: Sequence[str], value: Any, what: str) -> dict[str, float]:
    if isinstance(value, str):
        value = {value: 1.0}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected an {what} name or a mapping of {what} probabilities; found {value!r}")
    probs: dict[str, float] = {}
    for name, p in value.items():
        if name not in names:
            raise ValueError(f"unknown {what} {name!r}; expected one of {', '.join(map(repr, names))}")
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"the probability of {name!r} must be a number from 0 to 1; found {p!r}")
        probs[name] = float(p)
    total = sum(probs.values())
    rest = [name for name in names if name not in probs]
    if total > 1.0 + _TOLERANCE or (not rest and abs(total - 1.0) > _TOLERANCE):
        raise ValueError(f"the probabilities add up to {total:g}; expected 1")
    for name in rest:
        probs[name] = max(1.0 - total, 0.0) / len(rest)  # a total within the tolerance over 1 leaves 0, not < 0
    return {name: probs[name] for name in names}
