"""An answer judged by its policy's answer guard (issue 27): the state the engine reads, the verdict, and what each
judgement leaves behind: a decision log line (`d3router replay` re-judges it, `calibrate` fits answer thresholds on
it) and a `d3.answer` trace span, a child of the upstream attempt it judges (or of explain's request).

    verdict = await judge(service, guard, d3, Answered("the text", []), request_id="r1", caller="key:app")

Used by both faces (router/_faces/guarded.py, router/_faces/windows.py), by explain for an answer and by replay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from d3backend import Answer, EngineError
from policies import AnswerGuard, AnswerVerdict, Block, Policy, Replace
from router._apis.answers import Answered, Call, read_answer
from router._decision.record import D3Decision, _answer_json
from router._decision.service import Explainer, RouterService
from router._errors import BadRequest
from router._observe import tracing

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Judgement:
    """One engine judgement of (a slice of) an answer: the state it read, the engine's answers, the verdict."""

    state: dict[str, Any]
    verdict: AnswerVerdict
    answers: Mapping[str, Answer]
    ms: float
    cached: bool
    error: str | None = None

    @property
    def outcome(self) -> str:
        return "pass" if self.verdict.action is None else self.verdict.action.kind


def answer_state(
    guard: AnswerGuard, request: Any, text: str, calls: Sequence[Call | Mapping[str, Any]]
) -> dict[str, Any]:
    """What the engine reads about an answer: the request's own state (with `context`), the answer's text and its tool
    calls as the guard's `read` says, in that order (the cache's key is made of it)."""
    state: dict[str, Any] = {}
    if guard.context and request is not None:
        state["request"] = request
    if guard.read in ("text", "both"):
        state["answer"] = text
    if guard.read in ("tool_calls", "both"):
        state["tool_calls"] = [
            {"name": call.name, "arguments": call.arguments} if isinstance(call, Call) else dict(call) for call in calls
        ]
    return state


async def ask(service: RouterService, guard: AnswerGuard, policy: str, state: dict[str, Any],
              window: int | None = None) -> Judgement:  # fmt: skip
    """The guard's questions asked about `state`, in a `d3.answer` span; closed when the engine cannot answer, unless
    the guard says `on_engine_error: pass`."""
    start = time.perf_counter()
    with tracing.span("d3.answer") as span:
        span.set_attribute("d3.policy", policy)
        if window is not None:
            span.set_attribute("d3.answer.window", window)
        service.metrics.answer_judgements[policy] += 1
        try:
            decided = await service.ask(state, guard.questions)
        except (EngineError, TimeoutError) as exc:
            verdict = guard.engine_failed()
            error = str(exc) or type(exc).__name__
            outcome = "withheld" if verdict.action is not None else "passed unjudged"
            logger.warning("policy %r: the engine could not judge an answer (%s); it is %s (answer.on_engine_error)",
                           policy, error, outcome)  # fmt: skip
            judged = Judgement(state, verdict, {}, (time.perf_counter() - start) * 1000.0, False, error)
        else:
            verdict = guard.evaluate(decided.answers)
            judged = Judgement(state, verdict, decided.answers, (time.perf_counter() - start) * 1000.0, decided.cached)
            span.set_attribute("d3.cache", "hit" if decided.cached else "miss")
        span.set_attribute("d3.answer.rule", verdict.rule or "-")
        span.set_attribute("d3.answer.outcome", judged.outcome)
        span.set_attribute("d3.degraded", verdict.degraded)
    return judged


async def judge(
    service: RouterService, guard: AnswerGuard, d3: D3Decision, answered: Answered, *, request_id: str = "",
    caller: str = "", window: int | None = None,
) -> AnswerVerdict:  # fmt: skip
    """The guard's verdict on one answer (or one window of a stream, `window` its index), each judgement logged.

    A text longer than `max_chars` is judged in slices of `max_chars` overlapping by up to `overlap_chars`, all at
    once (nothing is cut unread: a marker at the end of a long answer is read too); the first slice that a rule
    stops decides, tool calls are judged with the first slice."""
    if not guard.questions:
        return guard.evaluate({})
    request = d3.state.state
    judged = await asyncio.gather(*(ask(service, guard, d3.policy, answer_state(guard, request, text,
                                                                                answered.calls if first else []),
                                        window) for first, text in slices(answered.text, guard)))  # fmt: skip
    for index, judgement in enumerate(judged):
        log(service, d3.policy, judgement, request_id, caller, window, index if len(judged) > 1 else None)
    return combined(judged)


def combined(judged: Sequence[Judgement]) -> AnswerVerdict:
    """The verdict of an answer judged in slices: the first slice a rule stops (or the engine failed on), with the
    tags of the slices up to it; else the last."""
    tags: dict[str, str] = {}
    for judgement in judged:
        tags.update(judgement.verdict.tags)
        if judgement.verdict.action is not None or judgement.verdict.degraded:
            return dataclasses.replace(judgement.verdict, tags=tags)
    return dataclasses.replace(judged[-1].verdict, tags=tags)


def slices(text: str, guard: AnswerGuard) -> list[tuple[bool, str]]:
    """`text` in the slices the engine reads: (whether it is the first, the slice)."""
    size = guard.max_chars
    if len(text) <= size:
        return [(True, text)]
    step = size - min(guard.overlap_chars, size // 2)
    return [(at == 0, text[at : at + size]) for at in range(0, len(text) - size + step, step)]


def log(service: RouterService, policy: str, judged: Judgement, request_id: str, caller: str,
        window: int | None, part: int | None) -> None:  # fmt: skip
    """The decision log's line of one answer judgement (`kind: answer`); the state the engine read only with
    `decision_log.states` (it is the answer's text: user content), within `max_state_chars`."""
    if service.decision_log is None:
        return
    entry: dict[str, Any] = {
        "time": round(time.time(), 3),
        "kind": "answer",
        "request_id": request_id,
        "caller": caller,
        "policy": policy,
        "rule": judged.verdict.rule or "-",
        "outcome": judged.outcome,
        "answers": {qid: _answer_json(answer) for qid, answer in judged.answers.items()},
        "decision_ms": round(judged.ms, 3),
        "cached": judged.cached,
        "degraded": judged.verdict.degraded,
    }
    if window is not None:
        entry["window"] = window
    if part is not None:
        entry["slice"] = part
    settings = service.config.server.decision_log
    if settings is not None and (settings.states or settings.include_text):
        size = len(json_text(judged.state))
        if size <= settings.max_state_chars:
            entry["state"] = judged.state
        else:
            entry["state_omitted"] = f"over decision_log.max_state_chars ({settings.max_state_chars})"
    service.write_line(entry)


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- explain for an answer (`POST /v1/d3/explain` with `d3_answer`) ----------------------------------------------
async def explain(service: RouterService, policy: Policy, d3: D3Decision, given: Any, api: str) -> dict[str, Any]:
    """What the policy's answer guard says of the answer `given` (as a whole answer is judged: in slices of
    `max_chars`), each engine call's state, answers and rule trace; nothing is logged. `BadRequest` when the policy
    has no answer guard or `given` is not an answer."""
    guard = policy.answer
    if guard is None:
        raise BadRequest(f"policy {policy.name!r} has no answer guard to judge `d3_answer` with")
    answered = given_answer(given, api)
    if guard.questions:
        parts = slices(answered.text, guard)
        judged = list(await asyncio.gather(*(ask(service, guard, policy.name, answer_state(
            guard, d3.state.state, text, answered.calls if first else [])) for first, text in parts)))  # fmt: skip
        verdict = combined(judged)
    else:
        judged, verdict = [], guard.evaluate({})
    action = verdict.action
    return {
        "read": guard.read,
        "context": guard.context,
        "text_chars": len(answered.text),
        "tool_calls": [{"name": call.name, "arguments": call.arguments} for call in answered.calls],
        "questions": {qid: question.to_wire() for qid, question in guard.questions.items()},
        "judgements": [_judgement_json(j) for j in judged],
        "verdict": {
            "rule": verdict.rule or "-",
            "outcome": "pass" if action is None else action.kind,
            **({"status": action.status, "message": action.message} if isinstance(action, Block) else {}),
            **({"text": action.text} if isinstance(action, Replace) else {}),
            "tags": dict(verdict.tags),
            "degraded": verdict.degraded,
            "trace": _trace(verdict),
        },
    }


def _judgement_json(j: Judgement) -> dict[str, Any]:
    return {"state": j.state, "answers": {qid: _answer_json(a) for qid, a in j.answers.items()},
            "rule": j.verdict.rule or "-", "outcome": j.outcome, "trace": _trace(j.verdict), "engine_error": j.error,
            "cached": j.cached, "decision_ms": round(j.ms, 3)}  # fmt: skip


def _trace(verdict: AnswerVerdict) -> list[dict[str, Any]]:
    return [{"rule": s.rule, "when": s.when, "matched": s.matched} for s in verdict.trace]


def given_answer(given: Any, api: str) -> Answered:
    """`d3_answer` as an answer: `{"text": ..., "tool_calls": [{"name", "arguments"}]}` (or a string, the text),
    `{"body": {...}}` (an answer in the API's JSON shape) or `{"events": "data: ..."}` (a stream's bytes, as text)."""
    if isinstance(given, str):
        return Answered(given)
    if isinstance(given, dict) and set(given) <= {"text", "tool_calls"} and given:
        calls = given.get("tool_calls", [])
        if isinstance(given.get("text", ""), str) and isinstance(calls, list) and all(
            isinstance(call, dict) and isinstance(call.get("name"), str) for call in calls
        ):  # fmt: skip
            return Answered(given.get("text", ""), [Call(call["name"], _arguments(call.get("arguments", "")))
                                                    for call in calls])  # fmt: skip
    elif isinstance(given, dict) and set(given) == {"body"} and isinstance(given["body"], dict):
        return read_answer(api, json.dumps(given["body"]).encode(), streamed=False)
    elif isinstance(given, dict) and set(given) == {"events"} and isinstance(given["events"], str):
        return read_answer(api, given["events"].encode(), streamed=True)
    raise BadRequest(
        '`d3_answer` must be {"text": "...", "tool_calls": [{"name": "...", "arguments": "..."}]}, '
        '{"body": ANSWER} (the API\'s JSON answer) or {"events": "data: ..."} (a stream as text)'
    )


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def answer_explainer(service: RouterService, body: dict[str, Any], api: str
                     ) -> tuple[dict[str, Any], Explainer | None]:  # fmt: skip
    """Explain's request body without its `d3_answer`, and what explains the answer guard's verdict on that answer
    (None when the body gives none)."""
    if "d3_answer" not in body:
        return body, None
    given = body["d3_answer"]

    async def explained(policy: Policy, d3: D3Decision) -> dict[str, Any]:
        return await explain(service, policy, d3, given, api)

    return {key: value for key, value in body.items() if key != "d3_answer"}, explained
