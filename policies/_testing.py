"""Policy test cases: answers in, the expected rule and action out, kept in the policy file and run by
`d3router test` so users keep their policies under CI like code.

    tests:
      - {answers: {jailbreak: 0.97}, expect: {rule: refuse-jailbreak, block: 403}}
      - {answers: {kind: code, difficulty: 2.5}, expect: {route: large, tags: {x-team: platform}}}
      - {engine_error: true, expect: {route: small, degraded: true}}

The answers take `d3backend.answer_from`'s shorthand: P(yes) for a noul, an option name or a mapping of
probabilities for a choice, the expected level or a level name for a score.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from d3backend import Answer
from policies._answer import AnswerTest
from policies._errors import EvaluationError
from policies._facts import Facts
from policies._policy import Block, Decision, Policy, Route


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
    facts: Facts = field(default_factory=dict)  # the facts the case gives (`facts:`), as the router computes them

    @property
    def label(self) -> str:
        return f"{self.policy} #{self.index + 1}" + (f" {self.name!r}" if self.name else "")


@dataclass(frozen=True, slots=True)
class TestResult:
    test: PolicyTest | AnswerTest
    passed: bool
    message: str
    decision: Decision | None


def run_test(policy: Policy, test: PolicyTest | AnswerTest) -> TestResult:
    """Evaluate one case and compare the decision (or an answer guard's verdict) with what it expects."""
    if isinstance(test, AnswerTest):
        problems = test.check(policy.answer) if policy.answer is not None else ["the policy has no answer guard"]
        return TestResult(test, not problems, "; ".join(problems), None)
    try:
        decision = policy.engine_failed() if test.engine_error else policy.evaluate(test.answers, test.facts)
    except EvaluationError as exc:
        where = "`facts`" if "give the facts" in str(exc) else "`answers`"
        return TestResult(test, False, f"{exc}; give it in {where}", None)
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
