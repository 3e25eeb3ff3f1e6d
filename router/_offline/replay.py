"""`d3router replay`: run recorded or written traffic through the engine and the policies, as the router would.

    lines, bad = read_traffic("traffic.jsonl", config)           # bad lines: (line number, why), never raised
    outcomes = await replay(config, lines, engine=engine, concurrency=8)
    report = summarize(config, outcomes, ...)                      # router/_offline/report.py

A traffic file holds one JSON object a line, any of:
    {"model": "auto", "messages": [...]}                             a chat request body
    {"request": {...body...}, "expect": {"rule": "hard-code"}}       a body with its label ({"route": "large"},
                                                                     {"block": true})
    {"policy": "auto", "state_from": "last_user", "state": "..."}    a decision log line (`decision_log.states`)
    {"kind": "answer", "policy": "auto", "state": {"answer": ...}}   an answer guard's log line, re-judged by the
                                                                     policy's answer guard (`expect` may label it:
                                                                     {"rule": NAME}, {"rule": "-"}, {"block": true})

Every line is decided by the router's own `RouterService.decide` (same state extraction, same engine behind the
same cache); `_decide_line` is the one place that turns a configuration and a body into a decision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from d3backend import Answer, DecisionEngine
from policies import Config, EvaluationError, Policy, Route
from router._apis.registry import detect
from router._apis.state import MediaRules
from router._decision.judge import answer_state, ask
from router._decision.record import D3Decision
from router._decision.service import RouterService
from router._errors import BadRequest
from router._observe.usage import Tokens

MAX_LINE_CHARS = 4 * 1024 * 1024
_ROLE_PREFIX = re.compile(r"\n\n(?=(?:system|developer|user|assistant|tool|function): )")
_ROLE_START = re.compile(r"^(system|developer|user|assistant|tool|function): ")


class TrafficError(Exception):
    """The traffic file cannot be read, or (with `strict`) one of its lines is malformed."""


@dataclass(frozen=True, slots=True)
class Label:
    """What a line is expected to decide: a rule's name, an upstream's name, or a block."""

    kind: Literal["rule", "route", "block"]
    value: str  # the rule, the upstream, or "block"

    def __str__(self) -> str:
        return f"{self.kind} {self.value}" if self.kind != "block" else "block"


@dataclass(frozen=True, slots=True)
class TrafficLine:
    line: int  # 1-based, in the file
    body: Mapping[str, Any]  # a chat request body (rebuilt from the state for a decision log line)
    label: Label | None = None
    policy: str | None = None  # named by a decision log line; otherwise the body's model picks it
    media_missing: int = 0  # images and videos the log counted but did not keep
    answer: Mapping[str, Any] | None = None  # an answer guard's log line: the state its engine read (issue 27)
    usage: Tokens | None = None  # the tokens its upstream reported (issue 29.3): logged, or the line's own `usage`
    logged_cost: float | None = None  # a decision-log line's `cost`


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    error: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.error}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One line replayed under one configuration; `policy` None: its model names no policy (passed through)."""

    line: TrafficLine
    policy: str | None
    rule: str = ""
    action: str = ""  # "route" or "block"
    upstream: str | None = None  # the first upstream of a route
    answers: Mapping[str, Answer] | None = None
    decision_ms: float = 0.0
    error: str | None = None  # the engine failed twice (the decision is then on_engine_error's)
    retried: bool = False
    kind: Literal["request", "answer"] = "request"  # an answer: `action` is the verdict (pass, block, replace)

    @property
    def target(self) -> str:
        """`large` or `block`: where the decision sends the request; an answer's verdict (`pass`, `block`...)."""
        if self.kind == "answer":
            return self.action
        return self.upstream if self.upstream is not None else "block"


def policy_for(config: Config, line: TrafficLine, fallback: str | None = None) -> str | None:
    """The policy that decides `line`: the log's, the body's model, else `fallback` (`--policy`), else the
    configuration's `server.default_policy`, as the router picks it."""
    if line.policy is not None:
        return line.policy if line.policy in config.policies else fallback
    model = line.body.get("model")
    if isinstance(model, str) and model in config.policies:
        return model
    return fallback if fallback is not None else config.server.default_policy


async def _decide_line(service: RouterService, config: Config, body: Mapping[str, Any], policy: str) -> D3Decision:
    """The router's decision for `body` under `policy`, read by the adapter of the API it is written for."""
    return await service.decide(config.policies[policy], body, api=detect(dict(body)))


# --- reading ------------------------------------------------------------------------------------------------------
def read_traffic(
    path: str, config: Config, *, fallback: str | None = None, strict: bool = False
) -> tuple[list[TrafficLine], list[BadLine]]:
    """Parse the traffic file; a malformed line is returned in the second list (raised with `strict`)."""
    try:
        with open(path, encoding="utf-8") as handle:
            texts = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrafficError(f"cannot read the traffic file {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    lines: list[TrafficLine] = []
    bad: list[BadLine] = []
    server = config.server
    media = MediaRules(frozenset(host.lower() for host in server.media_hosts), server.max_media_bytes,
                       server.max_media_items)  # fmt: skip
    for number, text in enumerate(texts, start=1):
        if not text.strip():
            continue
        try:
            line = parse_line(number, text)
            _check(line, config, fallback, media)
        except ValueError as exc:
            if strict:
                raise TrafficError(f"{path}: line {number}: {exc}") from None
            bad.append(BadLine(number, str(exc)))
            continue
        lines.append(line)
    return lines, bad


def parse_line(number: int, text: str) -> TrafficLine:
    """One traffic line; raise `ValueError` saying what is wrong with it."""
    if len(text) > MAX_LINE_CHARS:
        raise ValueError(f"the line is over {MAX_LINE_CHARS // 2**20} MiB")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    if "request" in data:
        unknown = sorted(set(data) - {"request", "expect", "usage"})
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; a labelled line holds `request`, `expect` and `usage`")
        if not isinstance(data["request"], dict):
            raise ValueError("`request` must be a request body (an object with `messages`, `prompt` or `input`)")
        return TrafficLine(number, data["request"], _label(data.get("expect")), usage=_usage(data.get("usage")))
    if data.get("kind") == "answer":
        return _answer_line(number, data)
    if "policy" in data and ("state" in data or "state_omitted" in data or "state_from" in data):
        return _log_line(number, data)
    if "messages" in data or "prompt" in data or "input" in data:
        return TrafficLine(number, data)
    raise ValueError(
        "expected a request body (with `messages`, `prompt` or `input`), {request, expect}, or a decision log line"
        " with `state`"
    )


def _usage(value: Any) -> Tokens | None:
    """A line's `usage` ({input, cached, output}, as the decision log writes it), or None when it has none."""
    if value is None:
        return None
    counts = {key: value.get(key, 0) for key in ("input", "cached", "output")} if isinstance(value, dict) else None
    if (
        counts is None
        or set(value) - set(counts)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values())
    ):
        raise ValueError("`usage` must be {input, cached, output} token counts (whole numbers, 0 or more)")
    return Tokens(counts["input"], counts["cached"], counts["output"], reported=True)


def _label(expect: Any) -> Label | None:
    if expect is None:
        return None
    if not isinstance(expect, dict) or len(expect) != 1:
        raise ValueError('`expect` must hold one of {"rule": NAME}, {"route": UPSTREAM}, {"block": true}')
    (kind, value), *_ = expect.items()
    if kind in ("rule", "route") and isinstance(value, str) and value:
        return Label(kind, value)
    if kind == "block" and value is True:
        return Label("block", "block")
    shapes = '{"rule": NAME}, {"route": NAME} or {"block": true}'
    raise ValueError(f"`expect` has {kind!r}: {value!r}; expected {shapes}")


def _answer_line(number: int, data: Mapping[str, Any]) -> TrafficLine:
    """An answer guard's decision log line (router/_decision/judge.py), labelled or not."""
    policy, state = data.get("policy"), data.get("state")
    if not isinstance(policy, str):
        raise ValueError("the answer log line's `policy` must be a string")
    if "state_omitted" in data and state is None:
        raise ValueError(f"the answer was not logged ({data['state_omitted']})")
    if not isinstance(state, dict):
        raise ValueError("the answer log line has no state to judge again; log with `decision_log.states: true`")
    return TrafficLine(number, {}, _label(data.get("expect")), policy=policy, answer=state)


def _log_line(number: int, data: Mapping[str, Any]) -> TrafficLine:
    """A decision log line back into a body whose extraction gives the logged state again, with its usage."""
    line = _logged_body(number, data)
    spent = data.get("cost")
    logged_cost = float(spent) if isinstance(spent, (int, float)) and not isinstance(spent, bool) else None
    return dataclasses.replace(line, usage=_usage(data.get("usage")), logged_cost=logged_cost)


def _logged_body(number: int, data: Mapping[str, Any]) -> TrafficLine:
    """The body of a decision log line, from its state."""
    policy = data["policy"]
    if not isinstance(policy, str):
        raise ValueError("the decision log line's `policy` must be a string")
    if "state_omitted" in data and "state" not in data:
        raise ValueError(f"the state was not logged ({data['state_omitted']})")
    source, state = data.get("state_from"), data.get("state")
    media = sum(n for n in (data.get("images"), data.get("videos")) if isinstance(n, int))
    if source == "json" and isinstance(state, list) and all(isinstance(turn, dict) for turn in state):
        return TrafficLine(number, {"messages": state}, policy=policy, media_missing=media)
    if not isinstance(state, str) or source not in ("last_user", "conversation"):
        raise ValueError("the decision log line has no replayable state; log with `decision_log.states: true`")
    if source == "last_user":
        body = {"messages": [{"role": "user", "content": state}]}
        return TrafficLine(number, body, policy=policy, media_missing=media)
    messages = []
    for turn in _ROLE_PREFIX.split(state):  # "user: a\n\nassistant: b", as router/_state.py joins them
        match = _ROLE_START.match(turn)
        if match is None:
            raise ValueError("the logged conversation was cut mid-turn (state.max_chars); it cannot be rebuilt")
        messages.append({"role": match.group(1), "content": turn[match.end() :]})
    return TrafficLine(number, {"messages": messages}, policy=policy, media_missing=media)


def _check(line: TrafficLine, config: Config, fallback: str | None, media: MediaRules) -> None:
    """Refuse a body the router would refuse (400) and a label naming what the configuration lacks."""
    name = policy_for(config, line, fallback)
    if name is None:
        return  # reported as passed through, not as malformed
    policy = config.policies[name]
    if line.answer is not None:
        _check_answer(line, policy)
        return
    api = detect(dict(line.body))
    try:
        api.state(line.body, policy.state, media, lenient=config.server.unknown_parts == "ignore")
    except BadRequest as exc:
        raise ValueError(f"the request is not a valid {api.name} request: {exc.message}") from None
    label = line.label
    if label is None:
        return
    if label.kind == "rule" and label.value not in {rule.name for rule in policy.rules}:
        known = ", ".join(repr(rule.name) for rule in policy.rules)
        raise ValueError(f"the label names rule {label.value!r}, which policy {name!r} lacks; expected one of {known}")
    if label.kind == "route" and label.value not in config.upstreams:
        known = ", ".join(repr(up) for up in config.upstreams)
        raise ValueError(f"the label names upstream {label.value!r}, which the configuration lacks; expected {known}")


def _check_answer(line: TrafficLine, policy: Policy) -> None:
    guard, label = policy.answer, line.label
    if guard is None:
        raise ValueError(f"policy {policy.name!r} has no answer guard to judge the answer with")
    if label is None:
        return
    known = {rule.name for rule in guard.rules} | {"-"}
    if label.kind == "route":
        raise ValueError('an answer is labelled {"rule": NAME} (`-`: it passes) or {"block": true}, not a route')
    if label.kind == "rule" and label.value not in known:
        raise ValueError(f"the label names answer rule {label.value!r}, which policy {policy.name!r} lacks; expected "
                         f"one of {', '.join(map(repr, sorted(known)))}")  # fmt: skip


# --- running ------------------------------------------------------------------------------------------------------
async def replay(
    config: Config,
    lines: Sequence[TrafficLine],
    *,
    engine: DecisionEngine | None,
    concurrency: int = 8,
    fallback: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Decide every line under `config` with `concurrency` lines in flight; outcomes in the lines' order."""
    service = RouterService(config, engine)
    outcomes: list[Outcome | None] = [None] * len(lines)
    queue = iter(range(len(lines)))
    done = 0

    async def worker() -> None:
        nonlocal done
        for index in queue:  # a shared iterator: each index is taken once
            outcomes[index] = await _one(service, config, lines[index], fallback)
            done += 1
            if progress is not None:
                progress(done)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(lines) or 1)))))
    return [outcome for outcome in outcomes if outcome is not None]


async def _one(service: RouterService, config: Config, line: TrafficLine, fallback: str | None) -> Outcome:
    name = policy_for(config, line, fallback)
    if name is None:
        return Outcome(line, None)
    if line.answer is not None:
        return await _judge_line(service, config, line, name)
    retried = False
    try:
        d3 = await _decide_line(service, config, line.body, name)
        if d3.engine_error is not None:  # retried once: a replay should not judge a policy on a hiccup
            retried = True
            d3 = await _decide_line(service, config, line.body, name)
    except BadRequest as exc:  # a line the other configuration's state settings refuse
        return Outcome(line, name, error=f"the request cannot be decided: {exc.message}")
    except EvaluationError as exc:
        return Outcome(line, name, error=str(exc))
    action = d3.decision.action
    upstream = action.upstreams[0] if isinstance(action, Route) else None
    return Outcome(
        line, name, d3.decision.rule, action.kind, upstream, d3.answers, d3.decision_ms, d3.engine_error, retried
    )


async def _judge_line(service: RouterService, config: Config, line: TrafficLine, name: str) -> Outcome:
    """An answer judged again by `name`'s answer guard as the router would (its `read` and `context` applied to the
    logged state); an engine failure retried once."""
    guard = config.policies[name].answer
    if guard is None:
        return Outcome(line, name, "(no answer guard)", "pass", kind="answer")
    logged = line.answer or {}
    calls = [call for call in logged.get("tool_calls") or [] if isinstance(call, dict)]
    state = answer_state(guard, logged.get("request"), str(logged.get("answer") or ""), calls)
    judged = await ask(service, guard, name, state)
    retried = judged.error is not None
    if retried:
        judged = await ask(service, guard, name, state)
    return Outcome(line, name, judged.verdict.rule or "-", judged.outcome, None, judged.answers, judged.ms,
                   judged.error, retried, kind="answer")  # fmt: skip
