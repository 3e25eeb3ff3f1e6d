"""`RouterService`: one request's decision, from its body to a `D3Decision`, under one configuration
snapshot; the engine call behind its deadline, the counts, the decision log.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from d3backend import (
    Answer,
    Decided,
    DecisionEngine,
    EngineError,
    EngineUnavailable,
    JSONValue,
    Question,
    json_bytes,
)
from policies import Config, Decision, Facts, Policy, Route
from router._apis.chat import CHAT, Api
from router._apis.facts import caller_facts as _caller_facts
from router._apis.facts import request_facts
from router._apis.state import DecisionState, MediaRules
from router._decision.deadline import within
from router._decision.pick import policy_for
from router._decision.record import D3Decision, _answer_json, agrees, decision_json
from router._decision.shadow import Shadows
from router._errors import ModelNotFound
from router._observe import tracing
from router._observe.decisionlog import DecisionLog
from router._observe.metrics import Counts, Metrics

logger = logging.getLogger(__name__)

ANONYMOUS = _caller_facts(None, None)
After = Callable[[D3Decision], Awaitable[D3Decision]]  # changes a decision before it is logged (sessions)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One configuration and what is derived from it: a request reads it once and is served under it whole, even
    when a reload swaps in another meanwhile."""

    config: Config
    media: MediaRules
    lenient: bool  # server.unknown_parts == "ignore"


Explainer = Callable[[Policy, D3Decision], Awaitable[dict[str, Any]]]


class RouterService:
    """Holds the current configuration (swapped whole on reload), the engine and the metrics."""

    def __init__(
        self,
        config: Config,
        engine: DecisionEngine | None,
        *,
        metrics: Metrics | None = None,
        decision_log: DecisionLog | TextIO | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics or Metrics()
        self.decision_log = decision_log
        # The engine's work: what `ask: staged` saves shows here (calls through the cache, hits included).
        self.engine_calls: Counts[str] = self.metrics.counter(
            "d3router_engine_calls", "Decision engine calls (through the cache, hits included), by policy.", ("policy",)
        )
        self.questions_asked: Counts[str] = self.metrics.counter(
            "d3router_questions_asked", "Questions asked of the decision engine, by policy.", ("policy",)
        )
        self.shadows = Shadows(self.metrics)
        self.questions_skipped: Counts[str] = self.metrics.counter(
            "d3router_questions_skipped",
            "Questions not asked because the walk ended without them (ask: staged, or on facts alone), by policy.",
            ("policy",),
        )

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

    def check(self, config: Config) -> None:
        """`RuntimeError` if `config` cannot be swapped in: it needs an engine we lack."""
        if self.engine is None and config.asks:
            raise RuntimeError("the new configuration asks questions, but no engine is running; restart the router")

    def swap(self, config: Config) -> None:
        """Use `config` from the next request on (the reload path); it must not need an engine we lack."""
        self.check(config)
        self.config = config

    async def decide(
        self, policy: Policy, body: Mapping[str, Any], request_id: str = "", *, api: Api = CHAT,
        snapshot: Snapshot | None = None, after: After | None = None, caller: str = "",
        caller_facts: Facts | None = None, defer_log: bool = False,
    ) -> D3Decision:  # fmt: skip
        """Decide for a parsed request body of `api` (chat by default) under `snapshot` (the current one by
        default); raise `BadRequest` when the body cannot be read. Engine trouble never raises: on_engine_error.
        `after` may change the decision before it is logged (the session's route, router/_sessions/session.py).
        `caller_facts` are the `caller.*` facts (`Caller.facts`); without them the caller's name and group are empty.
        A walk the facts settle asks the engine nothing. `defer_log`: the decision-log line is not written here; the
        face writes it (`log_entry`, then `write_log`) once the answer's usage is known."""
        snapshot = snapshot or self.snapshot
        with tracing.span("d3.state"):  # tracing (issue 14.4): the hooks are `with` blocks, no-ops when it is off
            state = api.state(body, policy.state, snapshot.media, lenient=snapshot.lenient)
        facts: dict[str, Any] = {}
        shadowed = snapshot.config.policies.get(policy.shadow) if policy.shadow is not None else None
        if policy.facts or (shadowed is not None and shadowed.facts):
            facts = request_facts(api, body, state)
            facts.update(caller_facts or ANONYMOUS)
        timeout_s = snapshot.config.server.decision_timeout_s
        start = time.perf_counter()
        answers: Mapping[str, Answer] = {}
        cached = False
        error: str | None = None
        skipped: tuple[str, ...] = ()
        calls = [0]  # the engine calls made, failed ones included
        engines: list[str] = []  # the pool's engines that answered them, in order
        settled = policy.walk({}, facts) if policy.settled_by_facts else None
        if not policy.questions:
            with tracing.span("d3.rules") as rules:
                decision = policy.evaluate({}, facts)
                rules.set_attribute("d3.rule", decision.rule)
        elif settled is not None:  # decided on facts alone (issue 29): no question could change the outcome
            decision = settled
            skipped = tuple(policy.questions)
            self.questions_skipped[policy.name] += len(skipped)
        elif self.engine is None:
            error = "no engine is configured"
            decision = policy.engine_failed()
        else:
            try:
                with tracing.engine_span() as engine_span:  # its traceparent goes to the engine
                    # No task, unlike wait_for; one budget for every stage; no timer for a cache hit (`within`).
                    walked, answers, cached = await within(
                        timeout_s, self._ask(self.engine, policy, state, calls, facts, engines)
                    )
                    engine_span.set_attribute("d3.cache", "hit" if cached else "miss")
            except EngineError as exc:
                error = str(exc)
                self.metrics.engine_errors[type(exc).__name__] += 1
                decision = policy.engine_failed()
            except TimeoutError:
                error = f"no decision within server.decision_timeout_s ({timeout_s:g} s)"
                self.metrics.engine_errors["DecisionTimeout"] += 1
                decision = policy.engine_failed()
            else:
                if len(answers) < len(policy.questions):
                    skipped = tuple(qid for qid in policy.questions if qid not in answers)
                    self.questions_skipped[policy.name] += len(skipped)
                with tracing.span("d3.rules") as rules:  # `staged` walked between its calls already
                    decision = walked if walked is not None else policy.evaluate(answers, facts)
                    rules.set_attribute("d3.rule", decision.rule)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        self.metrics.decision_seconds[policy.name].observe(elapsed_ms / 1000.0)
        if error is not None:
            logger.warning("policy %r: the engine failed (%s); %s decides", policy.name, error, decision.rule)
        d3 = D3Decision(
            policy.name,
            decision,
            answers,
            state,
            elapsed_ms,
            cached,
            error,
            skipped,
            calls[0],
            facts=facts,
            engine="+".join(dict.fromkeys(engines)),
        )
        if policy.shadow is not None and error is None:
            shadow = self.shadows.consider(d3, snapshot.config, self.engine, request_id, self._write)
            if shadow is not None:
                d3 = dataclasses.replace(d3, shadow=shadow)
        if after is not None:
            d3 = await after(d3)
        if self.decision_log is not None and not defer_log:
            self.write_log(self.log_entry(d3, request_id, snapshot.config, caller))
        return d3

    async def ask(
        self, state: JSONValue, questions: Mapping[str, Question], *, images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:  # fmt: skip
        """Questions of an application's own (`POST /v1/decisions`, `/v1/systemone`), asked of the router's engine
        as a policy's are: through the cache and single-flight, under `server.decision_timeout_s`, in an engine span,
        counted (cache, tokens, errors). Raises the `EngineError` (or `TimeoutError`) for the caller to answer."""
        if self.engine is None:
            raise EngineUnavailable("no decision engine is configured: set `engine` (no policy asks questions)")
        timeout_s = self.snapshot.config.server.decision_timeout_s
        try:
            with tracing.engine_span() as engine_span:
                decided = await within(timeout_s, self.engine.decide(state, questions, images=images, videos=videos))
                engine_span.set_attribute("d3.cache", "hit" if decided.cached else "miss")
        except EngineError as exc:
            self.metrics.engine_errors[type(exc).__name__] += 1
            raise
        except TimeoutError:
            self.metrics.engine_errors["DecisionTimeout"] += 1
            raise
        self.metrics.usage(decided)
        return decided

    async def aclose(self) -> None:
        """Cancel what runs in the background (shadow decisions still being asked) and wait for it."""
        await self.shadows.aclose()

    def write_line(self, entry: dict[str, Any]) -> None:
        """One line of the decision log, as a decision's (an answer guard's judgement: router/_decision/judge.py)."""
        self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        """One line: to the faces' `DecisionLog` (queued, never raising), or to a stream a library caller gave."""
        log = self.decision_log
        if isinstance(log, DecisionLog):
            log.write(json_bytes(entry).decode() + "\n")
        elif log is not None:
            log.write(json_bytes(entry).decode() + "\n")
            log.flush()

    async def _ask(
        self,
        engine: DecisionEngine,
        policy: Policy,
        state: DecisionState,
        calls: list[int],
        facts: Facts,
        engines: list[str],
    ) -> tuple[Decision | None, Mapping[str, Answer], bool]:
        """Ask the policy's stages in turn until the walk ends (`ask: together` has one stage, `staged` two: the
        guard's questions, then the rest only when the guard did not end the walk); count each call in `calls` as
        it starts (a failed one too). Return the decision, the answers asked and whether every call was a cache
        hit. Each stage is its own engine call, so a cache in front of the engine keeps each under its own key
        (state and that stage's questions): a repeated request finds both, and single-flight joins each."""
        if len(policy.stages) == 1:  # together: the one call, as before; the caller walks the rules
            self._count(policy, policy.questions, calls)
            decided = await engine.decide(state.state, policy.questions, images=state.images, videos=state.videos)
            self.metrics.usage(decided)
            if decided.engine:
                engines.append(decided.engine)
            return None, decided.answers, decided.cached
        answers: dict[str, Answer] = {}
        cached = True
        for stage in policy.stages:
            self._count(policy, stage, calls)
            decided = await engine.decide(state.state, stage, images=state.images, videos=state.videos)
            self.metrics.usage(decided)
            if decided.engine:
                engines.append(decided.engine)
            cached = cached and decided.cached
            answers.update(decided.answers)
            decision = policy.walk(answers, facts)
            if decision is not None:
                return decision, answers, cached
        # Unreachable: the last stage completes the answers, and a walk with every answer ends.
        return policy.evaluate(answers, facts), answers, cached

    def _count(self, policy: Policy, questions: Mapping[str, Question], calls: list[int]) -> None:
        calls[0] += 1
        self.engine_calls[policy.name] += 1
        self.questions_asked[policy.name] += len(questions)

    async def explain(
        self, body: Mapping[str, Any], api: Api = CHAT, after: After | None = None, caller: str = "",
        caller_facts: Facts | None = None, answer: Explainer | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The dry run of `POST /v1/d3/explain` and `d3router explain`: `BadRequest` (404) when no policy decides.
        With `answer`, its account of the policy and decision (an answer guard's verdict, issue 27) is `answer`."""
        model = body.get("model")
        policy = policy_for(self.snapshot.config, api, model)
        if policy is None:
            raise ModelNotFound(
                f"no policy is named {model!r} and server.default_policy is unset; explain needs a policy's name"
            )
        d3 = await self.decide(policy, body, api=api, after=after, caller=caller, caller_facts=caller_facts)
        payload = d3.explain()
        payload["api"] = api.name
        payload["questions"] = {qid: question.to_wire() for qid, question in policy.questions.items()}
        payload["ask"] = policy.ask
        if answer is not None:
            payload["answer"] = await answer(policy, d3)
        return payload

    def write_log(self, entry: dict[str, Any]) -> None:
        """Write one decision-log line (`log_entry`'s), if a decision log is open."""
        if self.decision_log is not None:
            self._write(entry)

    def log_entry(self, d3: D3Decision, request_id: str, config: Config, caller: str = "") -> dict[str, Any]:
        """The decision-log line of `d3`, as a mapping the face may add the answer's usage to."""
        entry: dict[str, Any] = {
            "time": round(time.time(), 3),
            "request_id": request_id,
            "caller": caller,  # the key's name (key:NAME), or a salted hash of the credential (anon:...)
            "policy": d3.policy,
            "rule": d3.decision.rule,
            "action": d3.action,
            "answers": {qid: _answer_json(answer) for qid, answer in d3.answers.items()},
            "decision_ms": round(d3.decision_ms, 3),
            "cached": d3.cached,
            "degraded": d3.decision.degraded,
        }
        if d3.engine:  # a pool's engine (engine.pool): which model's probabilities the rules read
            entry["engine"] = d3.engine
        if d3.skipped:
            entry["skipped"] = list(d3.skipped)
        if d3.facts:
            entry["facts"] = dict(d3.facts)
        if d3.session is not None:
            entry["session"] = d3.session
            entry["session_key"] = d3.session_key
            if isinstance(d3.decision.action, Route):
                entry["upstreams"] = list(d3.decision.action.upstreams)
        if d3.overlap:  # the speculative upstream request's outcome (issue 31.2)
            entry["overlap"] = dict(d3.overlap)
        if d3.shadow is not None:
            entry["shadow"] = decision_json(d3.shadow, agrees(d3.decision, d3.shadow))
        settings = config.server.decision_log
        if settings is not None and settings.include_text:
            entry["state"] = d3.state.state
        if settings is not None and settings.states:
            # What `d3router replay` reads back (router/_offline/replay.py): the state as the engine saw it, never cut,
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
        return entry
