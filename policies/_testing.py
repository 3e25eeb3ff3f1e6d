"""Policy test cases: answers in, the expected rule and action out, kept in the policy file and run by
`d3router test` so users keep their policies under CI like code.

    tests:
      - {answers: {jailbreak: 0.97}, expect: {rule: refuse-jailbreak, block: 403}}
      - {answers: {kind: code, difficulty: 2.5}, expect: {route: large, tags: {x-team: platform}}}
      - {engine_error: true, expect: {route: small, degraded: true}}

Answer shorthand: a noul takes P(yes); a choice an option name or a mapping of option probabilities; a score its
expected level (a number, split between the two nearest levels), a level name, or a mapping of level
probabilities. Options a mapping leaves out share what is left of 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from d3backend import Answer, Choice, ChoiceAnswer, Noul, NoulAnswer, Question, ScoreAnswer
from policies._errors import EvaluationError
from policies._policy import Block, Decision, Policy, Route

_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Expectation:
    rule: str | None = None
    route: tuple[str, ...] | None = None
    route_first_only: bool = True
    block: bool | int | None = None
    tags: Mapping[str, str] | None = None
    params: Mapping[str, Any] | None = None
    degraded: bool | None = None


@dataclass(frozen=True, slots=True)
class PolicyTest:
    policy: str
    index: int
    name: str | None
    line: int | None
    answers: Mapping[str, Answer]
    engine_error: bool
    expect: Expectation

    @property
    def label(self) -> str:
        return f"{self.policy} #{self.index + 1}" + (f" {self.name!r}" if self.name else "")


@dataclass(frozen=True, slots=True)
class TestResult:
    test: PolicyTest
    passed: bool
    message: str
    decision: Decision | None


def build_answer(question: Question, value: Any) -> Answer:
    """Turn a test case's shorthand into an answer; raise `ValueError` naming what was expected."""
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
        probs[name] = (1.0 - total) / len(rest)
    return {name: probs[name] for name in names}


def run_test(policy: Policy, test: PolicyTest) -> TestResult:
    """Evaluate one case and compare the decision with what it expects."""
    try:
        decision = policy.engine_failed() if test.engine_error else policy.evaluate(test.answers)
    except EvaluationError as exc:
        return TestResult(test, False, f"{exc}; give it in `answers`", None)
    problems = _compare(test.expect, decision)
    return TestResult(test, not problems, "; ".join(problems), decision)


def _compare(expect: Expectation, decision: Decision) -> list[str]:
    problems: list[str] = []
    action = decision.action
    if expect.rule is not None and decision.rule != expect.rule:
        problems.append(f"expected rule {expect.rule!r}, got {decision.rule!r}")
    if expect.route is not None:
        if not isinstance(action, Route):
            problems.append(f"expected a route to {_route(expect.route)}, got a block ({action.status})")
        else:
            routed = action.upstreams[:1] if expect.route_first_only else action.upstreams
            if routed != expect.route:
                problems.append(f"expected a route to {_route(expect.route)}, got {_route(action.upstreams)}")
    if expect.block is not None:
        blocked = isinstance(action, Block)
        if expect.block is False and blocked:
            problems.append("expected no block, got a block")
        elif expect.block is not False and not blocked:
            problems.append("expected a block, got a route")
        elif isinstance(action, Block) and expect.block is not True and action.status != expect.block:
            problems.append(f"expected block status {expect.block}, got {action.status}")
    checks: tuple[tuple[str, Mapping[str, Any] | None, Mapping[str, Any]], ...] = (
        ("tag", expect.tags, decision.tags),
        ("set", expect.params, decision.params),
    )
    for kind, wanted, got in checks:
        for key, value in (wanted or {}).items():
            if key not in got:
                problems.append(f"expected {kind} {key!r}={value!r}, it is not set")
            elif got[key] != value:
                problems.append(f"expected {kind} {key!r}={value!r}, got {got[key]!r}")
    if expect.degraded is not None and decision.degraded != expect.degraded:
        problems.append(f"expected degraded={str(expect.degraded).lower()}, got {str(decision.degraded).lower()}")
    if problems:
        problems.append("trace: " + ", ".join(_step(step.rule, step.when, step.matched) for step in decision.trace))
    return problems


def _route(upstreams: tuple[str, ...]) -> str:
    return " -> ".join(repr(name) for name in upstreams)


def _step(rule: str, when: str | None, matched: bool) -> str:
    return f"{rule} ({'matched' if matched else 'no'})" if when is not None else rule
