"""Answer guards (issue 27): questions and rules about what the upstream answered, judged before it reaches the client.

    policies:
      assistant:
        rules: [{name: default, route: big}]
        answer:                       # judged on every routed answer of this policy
          read: both                  # text, tool_calls or both
          questions:
            destructive: {type: noul, instructions: Does a tool call delete files or run downloaded code?}
          rules:
            - {name: no-destruction, when: destructive > 0.8, block: {status: 403, message: Refused.}}

The walk is a request policy's: rules in order, `tag` accumulates, and the first rule that blocks or replaces ends
it; an answer no rule stops passes as the upstream sent it. When the engine cannot judge the answer,
`on_engine_error` decides: a block (503) unless it says `pass`, since an unjudged answer is what the guard is for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from d3backend import Answer, Question, answer_from
from policies._errors import EvaluationError, Path
from policies._expr import compile_condition
from policies._lexer import ExpressionError
from policies._policy import Block, Rule, Step
from policies._schema import AnswerExpectSpec, AnswerSpec

ON_ENGINE_ERROR = "on_engine_error"


# --- the compiled guard ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Replace:
    """Answer with this text instead of the upstream's answer."""

    text: str
    kind: Literal["replace"] = field(default="replace", init=False)


AnswerAction = Block | Replace


@dataclass(frozen=True, slots=True)
class AnswerVerdict:
    """What the guard decided about one answer: `action` None lets it pass."""

    rule: str | None
    action: AnswerAction | None
    tags: Mapping[str, str]
    trace: tuple[Step, ...]
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class AnswerGuard:
    """A compiled answer guard. `questions` holds only those its rules read."""

    questions: Mapping[str, Question]
    rules: tuple[Rule, ...]
    read: Literal["text", "tool_calls", "both"] = "both"
    context: bool = True
    max_chars: int = 6000
    max_answer_bytes: int = 1024 * 1024
    window_chars: int = 1024
    overlap_chars: int = 256
    on_engine_error: Literal["block", "pass"] = "block"
    tests: tuple[AnswerTest, ...] = ()

    def evaluate(self, answers: Mapping[str, Answer]) -> AnswerVerdict:
        """Walk the rules over the engine's answers about the upstream's answer."""
        tags: dict[str, str] = {}
        trace: list[Step] = []
        for rule in self.rules:
            if rule.condition is not None:
                try:
                    matched = bool(rule.condition(answers))
                except KeyError as exc:
                    raise EvaluationError(
                        f"answer rule {rule.name!r} reads {exc.args[0]!r}, which has no answer"
                    ) from None
                if not matched:
                    trace.append(rule.missed)
                    continue
            trace.append(rule.matched)
            tags.update(rule.tags)
            if rule.action is not None:
                return AnswerVerdict(rule.name, rule.action, tags, tuple(trace))  # type: ignore[arg-type]
        return AnswerVerdict(None, None, tags, tuple(trace))

    def engine_failed(self) -> AnswerVerdict:
        """The verdict when the engine could not judge: closed (503) unless `on_engine_error: pass`."""
        step = (Step(ON_ENGINE_ERROR, None, True),)
        if self.on_engine_error == "pass":
            return AnswerVerdict(ON_ENGINE_ERROR, None, {}, step, degraded=True)
        block = Block(503, "The answer could not be checked, so it was withheld.")
        return AnswerVerdict(ON_ENGINE_ERROR, block, {}, step, degraded=True)


@dataclass(frozen=True, slots=True)
class AnswerTest:
    """An answer guard's test case (`answer.tests`), run by `d3router test` beside the policy's own."""

    policy: str
    index: int
    name: str | None
    line: int | None
    answers: Mapping[str, Answer]
    engine_error: bool
    expect: AnswerExpectSpec

    @property
    def label(self) -> str:
        return f"{self.policy} answer #{self.index + 1}" + (f" {self.name!r}" if self.name else "")

    def check(self, guard: AnswerGuard) -> list[str]:
        """What is wrong with the guard's verdict on the case's answers (nothing: it passes)."""
        try:
            verdict = guard.engine_failed() if self.engine_error else guard.evaluate(self.answers)
        except EvaluationError as exc:
            return [f"{exc}; give it in `answers`"]
        expect, action = self.expect, verdict.action
        outcome = "pass" if action is None else action.kind
        problems = []
        if expect.rule is not None and (verdict.rule or "-") != expect.rule:
            problems.append(f"expected answer rule {expect.rule!r}, got {verdict.rule or '-'!r}")
        if expect.outcome is not None and outcome != expect.outcome:
            problems.append(f"expected {expect.outcome}, got {outcome}")
        if expect.status is not None and (not isinstance(action, Block) or action.status != expect.status):
            problems.append(
                f"expected block status {expect.status}, got {action.status if isinstance(action, Block) else outcome}"
            )
        for key, value in (expect.tags or {}).items():
            if verdict.tags.get(key) != value:
                problems.append(f"expected tag {key!r}={value!r}, got {verdict.tags.get(key)!r}")
        if expect.degraded is not None and verdict.degraded != expect.degraded:
            problems.append(f"expected degraded={str(expect.degraded).lower()}, got {str(verdict.degraded).lower()}")
        if problems:
            problems.append("trace: " + ", ".join(f"{s.rule}{'' if s.matched else ' (missed)'}" for s in verdict.trace))
        return problems


class Reporter(Protocol):
    def issue(self, path: Path, message: str, *, warning: bool = False) -> None: ...

    def line(self, path: Path) -> int | None: ...


def compile_answer(
    spec: AnswerSpec, report: Reporter, question: Callable[[Any, Path], Question], path: Path, policy: str = ""
) -> AnswerGuard | None:
    """The guard `spec` describes, or None with its problems reported (as a policy's: names, conditions)."""
    declared: dict[str, Question] = {}
    for qid, raw in spec.questions.items():
        built = question(raw, (*path, "questions", qid))
        if built is not None:
            declared[qid] = built
    rules: list[Rule] = []
    read: set[str] = set()
    seen: set[str] = set()
    ok = True
    for index, rule in enumerate(spec.rules):
        rule_path: Path = (*path, "rules", index)
        if rule.name in seen:
            report.issue((*rule_path, "name"), f"answer rule name {rule.name!r} is used twice")
            ok = False
        seen.add(rule.name)
        condition, names = None, frozenset[str]()
        if rule.when is not None:
            try:
                condition, names = compile_condition(rule.when, declared)
            except ExpressionError as exc:
                report.issue((*rule_path, "when"), str(exc))
                ok = False
                continue
        facts = sorted(name for name in names if name not in declared)
        if facts:  # the request's facts are the request policy's; an answer rule reads the answer
            report.issue((*rule_path, "when"), f"answer rule {rule.name!r} reads {', '.join(facts)}: an answer rule "
                         "reads only the answer's questions; route on facts in the policy's own rules")  # fmt: skip
            ok = False
            continue
        read |= names
        action: AnswerAction | None = None
        if rule.block is not None:
            action = Block(rule.block.status, rule.block.message)
        elif rule.replace is not None:
            action = Replace(rule.replace)
        rules.append(Rule(rule.name, rule.when, condition, action, rule.tag, {}, names))  # type: ignore[arg-type]
    for qid in declared:
        if qid not in read:
            report.issue((*path, "questions", qid), f"answer question {qid!r} is not used by any rule", warning=True)
    tests = []
    known = {rule.name for rule in spec.rules} | {"-", ON_ENGINE_ERROR}
    for index, case in enumerate(spec.tests):
        case_path: Path = (*path, "tests", index)
        answers = {}
        for qid, value in case.answers.items():
            if qid not in declared:
                ids = ", ".join(map(repr, declared)) or "none"
                report.issue((*case_path, "answers", qid), f"unknown answer question {qid!r}; expected one of {ids}")
                ok = False
                continue
            try:
                answers[qid] = answer_from(declared[qid], value)
            except ValueError as exc:
                report.issue((*case_path, "answers", qid), str(exc))
                ok = False
        if case.expect.rule is not None and case.expect.rule not in known:
            report.issue((*case_path, "expect", "rule"), f"unknown answer rule {case.expect.rule!r}; expected one of "
                         f"{', '.join(map(repr, sorted(known)))}")  # fmt: skip
            ok = False
        tests.append(AnswerTest(policy, index, case.name, report.line(case_path), answers, case.engine_error,
                                case.expect))  # fmt: skip
    if not ok:
        return None
    return AnswerGuard(
        {qid: q for qid, q in declared.items() if qid in read},
        tuple(rules),
        spec.read,
        spec.context,
        spec.max_chars,
        spec.max_answer_bytes,
        spec.window_chars,
        spec.overlap_chars,
        spec.on_engine_error,
        tuple(tests),
    )
