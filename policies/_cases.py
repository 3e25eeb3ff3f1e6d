"""A policy's `tests:` cases checked and built: each case's answers, facts and what it expects."""

from __future__ import annotations

from d3backend import Question, answer_from
from policies._answer import ON_ENGINE_ERROR
from policies._checker import Checker
from policies._errors import Path
from policies._facts import fact_type_error
from policies._issues import locate
from policies._policy import Policy
from policies._schema import PolicySpec, TestCaseSpec
from policies._testing import Expectation, PolicyTest


def policy_tests(
    check: Checker, policy: Policy, spec: PolicySpec, declared: dict[str, Question], path: Path
) -> list[PolicyTest]:
    """The policy's cases; a case with a problem is reported to `check` and left out."""
    rule_names = {rule.name for rule in policy.rules} | {ON_ENGINE_ERROR}
    out: list[PolicyTest] = []
    for index, case in enumerate(spec.tests):
        case_path: Path = (*path, "tests", index)
        answers = {}
        for qid, value in case.answers.items():
            question = declared.get(qid)
            if question is None:
                known = ", ".join(map(repr, declared)) or "none"
                check.issue((*case_path, "answers", qid), f"unknown question {qid!r}; expected one of {known}")
                continue
            try:
                answers[qid] = answer_from(question, value)
            except ValueError as exc:
                check.issue((*case_path, "answers", qid), str(exc))
        for name, value in case.facts.items():
            problem = fact_type_error(name, value)
            if problem is not None:
                check.issue((*case_path, "facts", name), problem)
        expect = expectation(check, case, rule_names, (*case_path, "expect"))
        if expect is not None:
            line, _ = locate(case_path, check.marks)
            out.append(PolicyTest(policy.name, index, case.name, line, answers, case.engine_error, expect,
                                  dict(case.facts)))  # fmt: skip
    return out


def expectation(check: Checker, case: TestCaseSpec, rule_names: set[str], path: Path) -> Expectation | None:
    """What a case expects, its rule and upstreams known; None (reported) when it checks nothing."""
    spec = case.expect
    if all(value is None for value in (spec.rule, spec.route, spec.block, spec.tags, spec.set_, spec.degraded)):
        check.issue(path, "`expect` checks nothing; give `rule`, `route`, `block`, `tags`, `set` or `degraded`")
        return None
    if spec.rule is not None and spec.rule not in rule_names:
        check.issue(
            (*path, "rule"),
            f"unknown rule {spec.rule!r}; expected one of {', '.join(map(repr, sorted(rule_names)))}",
        )
    route = None
    if spec.route is not None:
        route = (spec.route,) if isinstance(spec.route, str) else tuple(spec.route)
        for name in route:
            if name not in check.spec.upstreams:
                check.issue((*path, "route"), f"unknown upstream {name!r}")
    if spec.route is not None and spec.block not in (None, False):
        check.issue(path, "`expect` cannot want both a route and a block")
    return Expectation(spec.rule, route, isinstance(spec.route, str), spec.block, spec.tags, spec.set_, spec.degraded)
