"""The decision record (`D3Decision`): what was asked, answered and done for one request, as headers, as
explain's JSON and as the decision log's line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from d3backend import (
    Answer,
    ChoiceAnswer,
    NoulAnswer,
    ScoreAnswer,
)
from policies import Block, Decision, Route
from router._apis.state import DecisionState

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class D3Decision:
    """What d3-router decided for one request; the middleware puts it at `request.state.d3`."""

    policy: str
    decision: Decision
    answers: Mapping[str, Answer]
    state: DecisionState
    decision_ms: float
    cached: bool
    engine_error: str | None = None
    # `ask: staged`: the questions the walk ended without (never asked), and the engine calls made (1 or 2).
    skipped: tuple[str, ...] = ()
    engine_calls: int = 0
    # `shadow: NAME`: that policy's decision on the same answers, never acted on (None when it has none, or when
    # it needed questions this request did not ask: then it is decided after the response, see RouterService).
    shadow: Decision | None = None
    # Sessions (router/_sessions/session.py): new, sticky, escalated or off for a routed turn; its hashed key.
    session: str | None = None
    session_key: str | None = None
    # The facts the router computed (policies/_facts.py): only for a policy (or its shadow) whose rules read some.
    facts: Mapping[str, Any] = field(default_factory=dict)
    # The pool's engine that answered (engine.pool, issue 28.2); engines joined by "+" when a staged walk's calls
    # were answered by two; empty for an engine alone.
    engine: str = ""
    # Overlap (issue 31, router/_faces/overlap.py): the speculation's outcome (used, blocked, rerouted, changed), the
    # upstream it started on and the tokens a cancelled one had cost, where the upstream reported them; else empty.
    overlap: Mapping[str, Any] = field(default_factory=dict)

    @property
    def action(self) -> str:
        return self.decision.action.kind

    def headers(self, upstream: str | None = None, *, full: bool = False) -> list[tuple[str, str]]:
        """The `x-d3-*` headers for the response. By default (issue 25.4) only those that cannot help a caller probe
        the guard or learn of other callers: `x-d3-policy`, `x-d3-action` and `x-d3-session` (its own, scoped by
        caller). `full` (a key with `debug`, or server.expose_decisions) adds the rule, the answers, the cache state
        and the decision's time (a hit is fast), the pool's engine that answered, the upstream, what the decision
        could not see (truncated text, dropped media, ignored parts) and the policy's tags. Tags toward the upstream
        are sent apart, always."""
        decision = self.decision
        headers = [("x-d3-policy", self.policy), ("x-d3-action", decision.action.kind)]
        if self.session is not None:
            headers.append(("x-d3-session", self.session))
        if not full:
            return headers
        headers += [
            ("x-d3-rule", decision.rule),
            ("x-d3-decision-ms", f"{self.decision_ms:.2f}"),
            ("x-d3-cache", "hit" if self.cached else ("none" if not self.answers else "miss")),
        ]
        if self.engine:  # the pool's engine whose probabilities the rules read (engine.pool, issue 28.2)
            headers.append(("x-d3-engine", self.engine))
        if upstream is not None:
            headers.append(("x-d3-upstream", upstream))
        if self.answers:
            headers.append(("x-d3-answers", format_answers(self.answers)))
        if self.skipped:
            headers.append(("x-d3-skipped", ",".join(self.skipped)))
        if self.overlap:  # whether the answer is the speculative request's: debug only, as x-d3-upstream (issue 25.4)
            headers.append(("x-d3-speculative", self.overlap["outcome"]))
        if decision.degraded:
            headers.append(("x-d3-degraded", "engine-error"))
        if self.state.truncated:
            headers.append(("x-d3-state-truncated", str(self.state.truncated)))
        if self.state.dropped:
            headers.append(("x-d3-media-dropped", str(len(self.state.dropped))))
        if self.state.ignored:
            headers.append(("x-d3-parts-ignored", str(self.state.ignored)))
        headers.extend(decision.tags.items())
        return headers

    def explain(self) -> dict[str, Any]:
        """The dry-run view of `POST /v1/d3/explain`."""
        action = self.decision.action
        return {
            "policy": self.policy,
            "state": self.state.state,
            "images": len(self.state.images),
            "videos": len(self.state.videos),
            "state_truncated_chars": self.state.truncated,
            "media_dropped": list(self.state.dropped),
            "parts_ignored": self.state.ignored,
            "answers": {qid: _answer_json(answer) for qid, answer in self.answers.items()},
            "asked": list(self.answers),
            "facts": dict(self.facts),
            "skipped": list(self.skipped),
            "engine_calls": self.engine_calls,
            "decision": {
                "rule": self.decision.rule,
                "action": action.kind,
                **({"upstreams": list(action.upstreams)} if isinstance(action, Route) else {}),
                **({"status": action.status, "message": action.message} if isinstance(action, Block) else {}),
                "tags": dict(self.decision.tags),
                "set": dict(self.decision.params),
                "degraded": self.decision.degraded,
                "trace": [{"rule": s.rule, "when": s.when, "matched": s.matched} for s in self.decision.trace],
            },
            "shadow": None if self.shadow is None else decision_json(self.shadow, agrees(self.decision, self.shadow)),
            "session": None if self.session is None else {"outcome": self.session, "key": self.session_key},
            "engine_error": self.engine_error,
            "decision_ms": round(self.decision_ms, 3),
            "cached": self.cached,
        }


def format_answers(answers: Mapping[str, Answer]) -> str:
    """`kind=code:0.91;jailbreak=0.02;difficulty=1.40`: a choice's pick and its probability, a noul's P(yes), a
    score's expected level."""
    parts = []
    for qid, answer in answers.items():
        if isinstance(answer, ChoiceAnswer):
            value = f"{answer.choice}:{answer.probabilities[answer.choice]:.2f}"
        elif isinstance(answer, NoulAnswer):
            value = f"{answer.noul:.2f}"
        else:
            value = f"{answer.score:.2f}"
        parts.append(f"{qid}={value}")
    return ";".join(parts)


def _answer_json(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, ChoiceAnswer):
        return {"type": "choice", "choice": answer.choice, "probabilities": dict(answer.probabilities),
                "confidence": answer.confidence}  # fmt: skip
    if isinstance(answer, NoulAnswer):
        return {"type": "noul", "noul": answer.noul, "confidence": answer.confidence}
    if not isinstance(answer, ScoreAnswer):
        raise TypeError(f"an answer of an unknown type: {type(answer).__name__}")
    return {"type": "score", "score": answer.score, "legend": list(answer.legend),
            "probabilities": list(answer.probabilities), "confidence": answer.confidence}  # fmt: skip


def agrees(live: Decision, shadow: Decision) -> bool:
    """Whether two decisions do the same: route to the same upstreams, or block with the same status."""
    a, b = live.action, shadow.action
    if isinstance(a, Route) and isinstance(b, Route):
        return a.upstreams == b.upstreams
    return isinstance(a, Block) and isinstance(b, Block) and a.status == b.status


def decision_json(decision: Decision, agree: bool) -> dict[str, Any]:
    action = decision.action
    target = {"upstreams": list(action.upstreams)} if isinstance(action, Route) else {"status": action.status}
    return {"policy": decision.policy, "rule": decision.rule, "action": action.kind, **target, "agrees": agree}
