"""Compiled policies and their evaluation.

A policy walks its rules in order. A rule whose condition holds (or that has none) applies: its `tag` and `set`
accumulate (a later rule's value for the same key wins), and if it routes or blocks the walk ends there. The
last rule is an unconditional route, so every walk ends with a `Decision`:

    >>> decision = policy.evaluate(engine_answers)          # doctest: +SKIP
    >>> decision.rule, decision.action                       # doctest: +SKIP
    ('hard-code', Route(upstreams=('large', 'small')))

Rules may read facts too (`request.tokens > 100000`, policies/_facts.py), given beside the answers:
`policy.walk({}, facts)` before any engine call ends the walk when the rules before the first question-reading
one decide (`settled_by_facts`), and then the engine is asked nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from d3backend import Answer, Question
from policies._errors import EvaluationError
from policies._expr import Condition
from policies._facts import FACTS, Facts
from policies._params import APIS

if TYPE_CHECKING:
    from policies._answer import AnswerGuard


@dataclass(frozen=True, slots=True)
class Route:
    """Send the request to the first upstream that answers, in this order."""

    upstreams: tuple[str, ...]
    kind: Literal["route"] = field(default="route", init=False)


@dataclass(frozen=True, slots=True)
class Block:
    """Refuse the request with an OpenAI-shaped error."""

    status: int
    message: str
    as_answer: bool = False  # answered as the model would: a normal assistant answer saying `message`
    kind: Literal["block"] = field(default="block", init=False)


Action = Route | Block


class Step(NamedTuple):
    """One rule tried: `matched` is its condition's value (always true for an unconditional rule)."""

    rule: str
    when: str | None
    matched: bool


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    when: str | None
    condition: Condition | None = field(repr=False, compare=False)
    action: Action | None
    tags: Mapping[str, str]
    params: Mapping[str, Any]
    reads: frozenset[str] = frozenset()  # the question ids and fact names its condition reads
    # The two trace steps this rule can add, built once: evaluation only picks one.
    matched: Step = field(init=False, repr=False, compare=False)
    missed: Step = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matched", Step(self.name, self.when, True))
        object.__setattr__(self, "missed", Step(self.name, self.when, False))


class Decision(NamedTuple):
    """The outcome of a policy: the action, the rule that chose it, and what the rules added on the way.

    A named tuple rather than a frozen dataclass: one is built per request, and this builds 6x faster.
    """

    policy: str
    rule: str
    action: Action
    tags: Mapping[str, str]
    params: Mapping[str, Any]
    trace: tuple[Step, ...]
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class StateSettings:
    source: Literal["last_user", "new", "conversation", "json"]
    max_chars: int


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """How a session's later turns are routed: `sticky`, `escalate` (by upstream tier, never down) or `off`."""

    mode: Literal["sticky", "escalate", "off"] = "sticky"
    ttl_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class OverlapSettings:
    """When to start the upstream request before the decision is in (issue 31): `always`, on `sticky` turns only, or
    on turns whose last `agreed` decisions in the session agreed; `route`: the upstream when no session names one."""

    when: Literal["always", "sticky", "agreeing"] = "always"
    route: str | None = None
    agreed: int = 2


@dataclass(frozen=True, slots=True)
class Policy:
    """A compiled policy. `questions` holds only those its rules read: the ones to ask the engine."""

    name: str
    description: str | None
    questions: Mapping[str, Question]
    rules: tuple[Rule, ...]
    on_engine_error: Rule
    state: StateSettings
    unused_questions: tuple[str, ...] = ()
    apis: frozenset[str] = frozenset(APIS)  # the client APIs it decides
    ask: Literal["together", "staged"] = "together"
    shadow: str | None = None  # a policy evaluated beside this one, never acted on
    session: SessionSettings = SessionSettings()
    answer: AnswerGuard | None = None  # questions about the upstream's answer (policies/_answer.py)
    overlap: OverlapSettings | None = None  # the upstream started while the engine decides (router/_faces/overlap.py)
    # The engine calls, in order, whose questions partition `questions`: one for `together`; for `staged`, the
    # questions of the rules up to the first that can route or block, then the rest (see `staging`).
    stages: tuple[Mapping[str, Question], ...] = field(init=False, repr=False, compare=False, default=())
    # The facts its rules read (the router computes none for a policy that reads none), and whether a walk over
    # the facts alone can end before any engine call: a rule that routes or blocks comes before the first rule
    # that reads a question.
    facts: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    settled_by_facts: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        stages = staging(self.rules, self.questions) if self.ask == "staged" else (self.questions,)
        object.__setattr__(self, "stages", tuple(stage for stage in stages if stage))
        object.__setattr__(
            self, "facts", frozenset(name for rule in self.rules for name in rule.reads if name in FACTS)
        )
        settled = False
        for rule in self.rules:
            if rule.reads - FACTS.keys():
                break
            if rule.action is not None:
                settled = bool(self.questions)  # with no question, every walk is over the facts anyway
                break
        object.__setattr__(self, "settled_by_facts", settled)

    def evaluate(self, answers: Mapping[str, Answer], facts: Facts | None = None) -> Decision:
        """Walk the rules over `answers` and `facts`; raise `EvaluationError` if a condition reads a missing answer
        or fact."""
        decision = self._walk(_known(answers, facts), partial=False)
        if decision is None:  # a full walk ends or raises
            raise EvaluationError(f"policy {self.name!r} has no default route")
        return decision

    def walk(self, answers: Mapping[str, Answer], facts: Facts | None = None) -> Decision | None:
        """Walk the rules over the answers asked so far (and `facts`); None when a rule reads a question not yet
        answered, before any rule ended the walk (ask the next stage, then walk again). `walk({}, facts)` is the
        walk before any engine call: it decides when the facts settle it.

        Exactly `evaluate` whenever it decides: a rule is only ever evaluated with every answer it reads, so the
        rules it walks match, miss, tag and set as they would with every answer, and the walk ends at the same rule.

            >>> policy.walk({"jailbreak": NoulAnswer(0.97)}).rule        # doctest: +SKIP
            'refuse-jailbreak'
            >>> policy.walk({"jailbreak": NoulAnswer(0.01)}) is None       # doctest: +SKIP
            True
        """
        return self._walk(_known(answers, facts), partial=True)

    def _walk(self, answers: Mapping[str, Any], *, partial: bool) -> Decision | None:
        tags: dict[str, str] = {}
        params: dict[str, Any] = {}
        trace: list[Step] = []
        for rule in self.rules:
            if partial and not rule.reads <= answers.keys():
                return None
            if rule.condition is not None:
                try:
                    matched = bool(rule.condition(answers))
                except KeyError as exc:
                    raise EvaluationError(
                        f"rule {rule.name!r} of policy {self.name!r} reads {exc.args[0]!r}, which has no "
                        + ("value: give the facts" if exc.args[0] in FACTS else "answer")
                    ) from None
                if not matched:
                    trace.append(rule.missed)
                    continue
            trace.append(rule.matched)
            if rule.tags:
                tags.update(rule.tags)
            if rule.params:
                params.update(rule.params)
            if rule.action is not None:
                return Decision(self.name, rule.name, rule.action, tags, params, tuple(trace))
        # Unreachable for a loaded policy: its last rule is an unconditional route.
        raise EvaluationError(f"policy {self.name!r} has no default route")

    def sent_on(self, decision: Decision, upstreams: tuple[str, ...]) -> Decision:
        """`decision` sent on `upstreams` instead of its own route (a session's sticky route): the tags and `set` of
        the route taken (issue 26.5). The rules that matched before the deciding one keep theirs (they describe the
        request); the deciding rule's own give way to those of the first rule routing to exactly `upstreams`, else
        of the first whose route starts with the same upstream, else to none; a later key wins, as in a walk.

            >>> policy.sent_on(decision, ("large",)).tags      # doctest: +SKIP
            {'x-team': 'platform', 'x-tier': 'large'}
        """
        action = decision.action
        if not isinstance(action, Route) or action.upstreams == upstreams:
            return decision
        by_name = {rule.name: rule for rule in self.rules}
        tags: dict[str, str] = {}
        params: dict[str, Any] = {}
        for step in decision.trace[:-1]:  # the last step is the deciding rule
            rule = by_name.get(step.rule)
            if step.matched and rule is not None:
                tags.update(rule.tags)
                params.update(rule.params)
        routes = [(rule, rule.action.upstreams) for rule in self.rules if isinstance(rule.action, Route)]
        taken = next((rule for rule, route in routes if route == upstreams), None)
        if taken is None:
            taken = next((rule for rule, route in routes if route[0] == upstreams[0]), None)
        if taken is not None:
            tags.update(taken.tags)
            params.update(taken.params)
        return decision._replace(action=Route(upstreams), tags=tags, params=params)

    def expected(self, upstreams: tuple[str, ...] | None = None) -> Decision:
        """The decision the default rule makes, sent on `upstreams` (the default route's when None): what an overlap
        speculates on, its tags and `set` as a session's route would carry them (`sent_on`)."""
        rule = self.rules[-1]
        if rule.action is None:  # the loader always gives the last rule a route
            raise EvaluationError(f"policy {self.name!r} has no default route")
        decision = Decision(self.name, rule.name, rule.action, dict(rule.tags), dict(rule.params), (rule.matched,))
        return decision if upstreams is None else self.sent_on(decision, upstreams)

    def engine_failed(self) -> Decision:
        """The decision when the engine could not answer: `on_engine_error`, marked degraded."""
        rule = self.on_engine_error
        if rule.action is None:  # the loader always gives it one
            raise EvaluationError(f"policy {self.name!r} has no on_engine_error action")
        return Decision(
            self.name,
            rule.name,
            rule.action,
            dict(rule.tags),
            dict(rule.params),
            (Step(rule.name, None, True),),
            degraded=True,
        )


def _known(answers: Mapping[str, Answer], facts: Facts | None) -> Mapping[str, Any]:
    """What the conditions read: the answers, and the facts when there are any (their names hold a dot, which no
    question id does, so neither hides the other)."""
    return {**facts, **answers} if facts else answers


def staging(rules: Sequence[Rule], questions: Mapping[str, Question]) -> tuple[Mapping[str, Question], ...]:
    """The stages of `ask: staged`: the questions read by the rules up to and including the first that can end the
    walk and reads a question (a conditional route or block: typically the guard), then every other question. A
    rule that reads only facts is settled before any engine call, so it does not end the first stage. Each stage
    keeps the declaration order; a stage may be empty (the caller drops it).

    A question of the second stage is read only by rules after that first one, so a walk that ends there never
    needs it; one that goes on pauses at the first rule reading it, and every question left is read from there on.
    """
    first: set[str] = set()
    for rule in rules:
        first |= rule.reads
        if rule.action is not None and rule.reads & questions.keys():
            break
    return (
        {qid: q for qid, q in questions.items() if qid in first},
        {qid: q for qid, q in questions.items() if qid not in first},
    )
