"""The part the proxy and the middleware share: from a chat request to a decision, with its headers.

service = RouterService(config, engine)
d3 = await service.decide(policy, body)         # never raises for engine trouble: on_engine_error decides
d3.decision.action, d3.headers(upstream="large")
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from d3backend import Answer, ChoiceAnswer, DecisionEngine, EngineError, NoulAnswer, ScoreAnswer, json_bytes
from policies import Block, Config, Decision, Policy, Route
from router import _tracing
from router._apis import CHAT, Api
from router._metrics import Metrics
from router._state import BadRequest, DecisionState, MediaRules

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

    @property
    def action(self) -> str:
        return self.decision.action.kind

    def headers(self, upstream: str | None = None) -> list[tuple[str, str]]:
        """The `x-d3-*` headers and the policy's tags, for the response (and the upstream request)."""
        decision = self.decision
        headers = [
            ("x-d3-policy", self.policy),
            ("x-d3-rule", decision.rule),
            ("x-d3-action", decision.action.kind),
            ("x-d3-decision-ms", f"{self.decision_ms:.2f}"),
            ("x-d3-cache", "hit" if self.cached else ("none" if not self.answers else "miss")),
        ]
        if upstream is not None:
            headers.append(("x-d3-upstream", upstream))
        if self.answers:
            headers.append(("x-d3-answers", format_answers(self.answers)))
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
            "engine_error": self.engine_error,
            "decision_ms": round(self.decision_ms, 3),
            "cached": self.cached,
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One configuration and what is derived from it: a request reads it once and is served under it whole, even
    when a reload swaps in another meanwhile."""

    config: Config
    media: MediaRules
    lenient: bool  # server.unknown_parts == "ignore"


class RouterService:
    """Holds the current configuration (swapped whole on reload), the engine and the metrics."""

    def __init__(
        self,
        config: Config,
        engine: DecisionEngine | None,
        *,
        metrics: Metrics | None = None,
        decision_log: TextIO | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics or Metrics()
        self.decision_log = decision_log

    @property
    def config(self) -> Config:
        return self.snapshot.config

    @config.setter
    def config(self, config: Config) -> None:
        # What is derived from the configuration is derived once, not on every request.
        server = config.server
        hosts = frozenset(host.lower() for host in server.media_hosts)
        media = MediaRules(hosts, server.max_media_bytes, server.max_media_items)
        self.snapshot = Snapshot(config, media, server.unknown_parts == "ignore")

    @property
    def media(self) -> MediaRules:
        return self.snapshot.media

    def swap(self, config: Config) -> None:
        """Use `config` from the next request on (the reload path); it must not need an engine we lack."""
        if self.engine is None and any(policy.questions for policy in config.policies.values()):
            raise RuntimeError("the new configuration asks questions, but no engine is running; restart the router")
        self.config = config

    async def decide(
        self, policy: Policy, body: Mapping[str, Any], request_id: str = "", *, api: Api = CHAT,
        snapshot: Snapshot | None = None,
    ) -> D3Decision:  # fmt: skip
        """Decide for a parsed request body of `api` (chat by default) under `snapshot` (the current one by
        default); raise `BadRequest` when the body cannot be read. Engine trouble never raises: on_engine_error."""
        snapshot = snapshot or self.snapshot
        with _tracing.span("d3.state"):  # tracing (issue 14.4): the hooks are `with` blocks, no-ops when it is off
            state = api.state(body, policy.state, snapshot.media, lenient=snapshot.lenient)
        timeout_s = snapshot.config.server.decision_timeout_s
        start = time.perf_counter()
        answers: Mapping[str, Answer] = {}
        cached = False
        error: str | None = None
        if not policy.questions:
            with _tracing.span("d3.rules") as rules:
                decision = policy.evaluate({})
                rules.set_attribute("d3.rule", decision.rule)
        elif self.engine is None:
            error = "no engine is configured"
            decision = policy.engine_failed()
        else:
            try:
                with _tracing.engine_span() as engine_span:  # its traceparent goes to the engine
                    async with asyncio.timeout(timeout_s):  # no task, unlike wait_for
                        decided = await self.engine.decide(
                            state.state, policy.questions, images=state.images, videos=state.videos
                        )
                    engine_span.set_attribute("d3.cache", "hit" if decided.cached else "miss")
            except EngineError as exc:
                error = str(exc)
                self.metrics.engine_errors[type(exc).__name__] += 1
                decision = policy.engine_failed()
            except TimeoutError:
                error = f"no decision within server.decision_timeout_s ({timeout_s:g} s)"
                self.metrics.engine_errors["DecisionTimeout"] += 1
                decision = policy.engine_failed()
            else:
                answers, cached = decided.answers, decided.cached
                self.metrics.cache["hit" if cached else "miss"] += 1
                with _tracing.span("d3.rules") as rules:
                    decision = policy.evaluate(answers)
                    rules.set_attribute("d3.rule", decision.rule)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        self.metrics.decision_seconds[policy.name].observe(elapsed_ms / 1000.0)
        if error is not None:
            logger.warning("policy %r: the engine failed (%s); %s decides", policy.name, error, decision.rule)
        d3 = D3Decision(policy.name, decision, answers, state, elapsed_ms, cached, error)
        if self.decision_log is not None:
            self._log(d3, request_id, snapshot.config)
        return d3

    async def explain(self, body: Mapping[str, Any], api: Api = CHAT) -> dict[str, Any]:
        """The dry run of `POST /v1/d3/explain` and `d3router explain`: `BadRequest` (404) when no policy decides."""
        config = self.snapshot.config
        model = body.get("model")
        policy = config.policies.get(model) if isinstance(model, str) else None
        if policy is None and config.server.default_policy is not None:
            policy = config.policies[config.server.default_policy]
        if policy is None:
            raise BadRequest(
                f"no policy is named {model!r} and server.default_policy is unset; explain needs a policy's name",
                "model", status=404,
            )  # fmt: skip
        d3 = await self.decide(policy, body, api=api)
        payload = d3.explain()
        payload["api"] = api.name
        payload["questions"] = {qid: question.to_wire() for qid, question in policy.questions.items()}
        return payload

    def _log(self, d3: D3Decision, request_id: str, config: Config) -> None:
        entry: dict[str, Any] = {
            "time": round(time.time(), 3),
            "request_id": request_id,
            "policy": d3.policy,
            "rule": d3.decision.rule,
            "action": d3.action,
            "answers": {qid: _answer_json(answer) for qid, answer in d3.answers.items()},
            "decision_ms": round(d3.decision_ms, 3),
            "cached": d3.cached,
            "degraded": d3.decision.degraded,
        }
        settings = config.server.decision_log
        if settings is not None and settings.include_text:
            entry["state"] = d3.state.state
        if settings is not None and settings.states:
            # What `d3router replay` reads back (router/_replay.py): the state as the engine saw it, never cut,
            # so that a replay decides on the same text; media are counted, not copied.
            policy = self.config.policies.get(d3.policy)
            entry["state_from"] = policy.state.source if policy is not None else None
            entry["images"], entry["videos"] = len(d3.state.images), len(d3.state.videos)
            text = d3.state.state
            size = len(text) if isinstance(text, str) else len(json_bytes(text))
            if size <= settings.max_state_chars:
                entry["state"] = text
            else:
                entry["state_omitted"] = f"over decision_log.max_state_chars ({settings.max_state_chars})"
        assert self.decision_log is not None  # checked by the caller
        self.decision_log.write(json_bytes(entry).decode() + "\n")
        self.decision_log.flush()


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
    assert isinstance(answer, ScoreAnswer)
    return {"type": "score", "score": answer.score, "legend": list(answer.legend),
            "probabilities": list(answer.probabilities), "confidence": answer.confidence}  # fmt: skip
