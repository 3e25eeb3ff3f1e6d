"""Overlap (issue 31): the upstream request starts while the engine decides, on the route the decision is expected
to take, and nothing of it reaches the client before the decision is in.

    overlap = Overlap(forwarder, sessions, lambda: service.metrics)      # one per app (router/_faces/proxy.py)
    await overlap.run(request, decided)                                  # decided(request, after): decide, then route

The expected route, for a policy with `overlap:` that asks the engine: the session's route (a sticky turn), else
`overlap.route`, else the policy's default route; its tags and `set` those the route's own rule carries, as a
session's route carries them (`Policy.expected`, `Policy.sent_on`). `when: sticky` speculates on a session's route
only; `when: agreeing` only when the session's last `agreed` decisions took the route expected of them (a count kept
in the session store, per policy and session).

The speculative request is exactly the one the decision would send if it took that route with those tags and that
`set`: the same upstream, the same body bytes (`Api.rewrite` of the same inputs) and the same headers (tags, the
session's readable encoding). The decision then agrees when its first upstream, its `set` and its tags are equal,
compared after the session's route replaced its own (`after`, before the decision log's line is written). Then:
  - it agrees (`used`): the response is relayed as it comes, streamed or not, with answer guards as without overlap;
  - a block (`blocked`), another first upstream (`rerouted`) or another `set` or tags (`changed`, the upstream request
    would differ): the speculative request is cancelled, its connection closed at once, before the block is
    answered or the request is sent where it belongs;
  - the client leaves, or the request fails before a decision (`abandoned`): cancelled too.
A body that is not an event stream is read while the decision is pending (what `relay` does anyway before it sends
anything), so a cancelled one that had finished reports its `usage`: the wasted tokens are counted where the upstream
reported them; a stream, or an answer cut off unfinished, reports none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx

from policies import Block, Decision, Policy, Route
from router._apis.usage import metered
from router._asgi.decoding import decoded, readable_accept_encoding
from router._asgi.headers import encode_headers
from router._asgi.relay import BUFFER_LIMIT
from router._decision.record import D3Decision
from router._decision.service import After
from router._faces.forward import Failure, Forwarder
from router._faces.request import Decided
from router._faces.translated import native
from router._observe import tracing
from router._observe.metrics import Counts, Metrics
from router._sessions.session import Sessions

logger = logging.getLogger(__name__)

Opened = tuple[httpx.Response | None, Failure]
Decide = Callable[[Decided, After], Awaitable[None]]
OUTCOMES = ("used", "blocked", "rerouted", "changed", "abandoned")


class Counters:
    """The overlap's metric families, made on first use (a router without overlap shows none)."""

    def __init__(self, metrics: Metrics) -> None:
        self.started: Counts[str] = metrics.counter(
            "d3router_speculations_started", "Upstream requests started before the decision (overlap), by policy.",
            ("policy",),
        )  # fmt: skip
        self.outcomes: Counts[tuple[str, str]] = metrics.counter(
            "d3router_speculations",
            "Speculative upstream requests by policy and outcome: used, or cancelled (blocked, rerouted, changed: "
            "the decision's set or tags differ, abandoned: the client left or the request failed first).",
            ("policy", "outcome"),
        )
        self.wasted_tokens: Counts[tuple[str, str]] = metrics.counter(
            "d3router_speculation_wasted_tokens",
            "Upstream tokens of cancelled speculative requests (input, output), where the upstream reported usage.",
            ("policy", "kind"),
        )


_COUNTERS: weakref.WeakKeyDictionary[Metrics, Counters] = weakref.WeakKeyDictionary()


def counters(metrics: Metrics) -> Counters:
    found = _COUNTERS.get(metrics)
    if found is None:
        found = _COUNTERS[metrics] = Counters(metrics)
    return found


class Overlap:
    """Starts speculative upstream requests for the app; per-request state lives in `Speculation`."""

    def __init__(self, forwarder: Forwarder, sessions: Sessions, metrics: Callable[[], Metrics]) -> None:
        self.forwarder = forwarder
        self.sessions = sessions
        self.metrics = metrics  # read when used: a benchmark may swap the service's metrics

    async def run(self, request: Decided, decide: Decide) -> None:
        """Start the speculation (if this request gets one), then `decide(request, after)`; whatever happens, a
        speculation not taken is cancelled and its response closed before this returns."""
        speculation = Speculation(self, request)
        request.speculation = speculation
        try:
            await speculation.start()
            await decide(request, speculation.after)
        finally:
            await speculation.discard()


class Speculation:
    """One request's speculative upstream request: started, then judged against the decision, taken or cancelled."""

    def __init__(self, overlap: Overlap, request: Decided) -> None:
        self.overlap = overlap
        self.request = request
        self.expected: Decision | None = None  # what the speculation assumes the decision will send
        self.task: asyncio.Task[Opened] | None = None
        self.outcome: str | None = None
        self.whole: bytes | None = None  # a plain body read whole while the decision was pending
        self.agreed_key: str | None = None
        self.agreed = 0
        self._taken = False
        self._counted = False

    @property
    def policy(self) -> Policy:
        if self.request.policy is None:  # run only for a decided request
            raise RuntimeError("a speculation needs the request's policy")
        return self.request.policy

    async def start(self) -> None:
        """Work out the expected route; start the upstream request on it when the policy's `when` allows."""
        policy, request, turn = self.policy, self.request, self.request.turn
        settings = policy.overlap
        if settings is None or not policy.questions:  # a walk without the engine is decided at once
            return
        stored = None
        if turn is not None and policy.session.mode != "off":
            stored = await turn.stored(policy.name, policy.session)
        route = stored[1] if stored is not None else None
        if settings.when == "sticky" and route is None:
            return
        self.expected = policy.expected(route or ((settings.route,) if settings.route else None))
        if settings.when == "agreeing":
            if stored is None or turn is None or turn.key is None:
                self.expected = None  # no session: nothing to count agreements in
                return
            self.agreed_key = f"d3:overlap:{policy.name}:{turn.key}"
            count = await self.overlap.sessions.store.get(self.agreed_key, policy.session.ttl_s)
            self.agreed = int(count) if count and count.isdigit() else 0
            if self.agreed < settings.agreed:
                return
        action = self.expected.action
        if not isinstance(action, Route):  # `expected` routes; a block is never speculated on
            return
        name = action.upstreams[0]
        upstream = request.config.upstreams[name]
        # Exactly what `ProxyApp._route` would send on this route with these tags and this `set`.
        payload = request.api.rewrite(request.raw, request.body, upstream.model, self.expected.params)
        payload, _ = metered(request.api.name, payload, request.body, upstream.count_usage)
        if not native(request.api, upstream, payload):  # a translated route: sent as `ProxyApp._route` carries it
            return
        tags = encode_headers(self.expected.tags.items())
        if turn is not None and turn.wants_answer:
            tags += readable_accept_encoding(request.scope["headers"])
        counters(self.overlap.metrics()).started[policy.name] += 1
        self.task = asyncio.ensure_future(self._open(name, payload, tags))

    async def _open(self, name: str, payload: bytes, tags: list[tuple[bytes, bytes]]) -> Opened:
        request = self.request
        upstream = request.config.upstreams[name]
        with tracing.span("d3.speculation"):
            response, failure = await self.overlap.forwarder.open(request.api, upstream, name, "POST",
                                                                  request.api.upstream_path, request.scope, payload,
                                                                  tags)  # fmt: skip
        if response is None:
            return response, failure
        try:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                await self._read_ahead(response)
        except BaseException:
            await response.aclose()  # cancelled while reading: the connection is closed with it
            raise
        return response, failure

    async def _read_ahead(self, response: httpx.Response) -> None:
        """Read a plain body (up to `BUFFER_LIMIT`) while the decision is pending, as `relay` reads it before it
        sends anything; the response then replays what was read and goes on with the rest."""
        inner = response.stream
        stream = inner.__aiter__()  # type: ignore[union-attr]
        chunks: list[bytes] = []
        size, rest, error = 0, None, None
        try:
            async for chunk in stream:
                chunks.append(chunk)
                size += len(chunk)
                if size > BUFFER_LIMIT:
                    rest = stream
                    break
            else:
                self.whole = b"".join(chunks)
        except httpx.HTTPError as exc:
            error = exc  # raised where it happened, to whoever reads the body
        response.stream = Replay(chunks, rest, error, inner)  # type: ignore[arg-type]

    async def after(self, d3: D3Decision) -> D3Decision:
        """The decision's `after`: the session's route first, then the judgement; a decision that does not agree
        cancels the speculation now, before anything is answered."""
        turn, policy = self.request.turn, self.policy
        if turn is not None:
            d3 = await turn.route(d3)
        expected = self.expected
        if expected is None:
            return d3 if policy.overlap is None else _with(d3, {"outcome": "none"})
        outcome = judge(expected, d3.decision)
        if self.agreed_key is not None:
            count = self.agreed + 1 if outcome == "used" else 0
            await self.overlap.sessions.store.set(self.agreed_key, str(count), policy.session.ttl_s)
        if self.task is None:
            return _with(d3, {"outcome": "none"})
        self.outcome = outcome
        action = expected.action
        record: dict[str, Any] = {"outcome": outcome,
                                  "upstream": action.upstreams[0] if isinstance(action, Route) else None}  # fmt: skip
        if outcome != "used":
            await self.cancel()
            record["wasted_tokens"] = self._wasted()
        self._count(outcome)
        return _with(d3, record)

    def take(self, name: str) -> Awaitable[Opened] | None:
        """The speculative request's response for the route's first attempt on `name`, if the decision agreed."""
        if self.task is None or self.outcome != "used" or self._taken or self.expected is None:
            return None
        action = self.expected.action
        if not isinstance(action, Route) or action.upstreams[0] != name:
            return None
        self._taken = True
        return self.task

    async def cancel(self) -> None:
        """Cancel the speculative request and close its connection (idempotent)."""
        task = self.task
        if task is None:
            return
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is None:
            response = task.result()[0]
            if response is not None:
                await response.aclose()

    async def discard(self) -> None:
        """The request ended: a speculation never judged was abandoned; none stays open (a taken response is closed
        by its relay; closing again does nothing)."""
        if self.task is not None and self.outcome is None:
            self._count("abandoned")
        await self.cancel()

    def _count(self, outcome: str) -> None:
        if self._counted:
            return
        self._counted = True
        found = counters(self.overlap.metrics())
        found.outcomes[(self.policy.name, outcome)] += 1
        tokens = self._wasted() if outcome != "used" else None
        if tokens is not None:
            found.wasted_tokens[(self.policy.name, "input")] += tokens["input"]
            found.wasted_tokens[(self.policy.name, "output")] += tokens["output"]

    def _wasted(self) -> dict[str, int] | None:
        """The cancelled request's tokens, from the usage of a body that had come whole; None when unknown."""
        if self.whole is None or self.task is None or not self.task.done() or self.task.cancelled():
            return None
        response = self.task.result()[0]
        if response is None or not response.is_success:
            return None
        return usage(self.whole, response.headers.get("content-encoding", ""))


class Replay(httpx.AsyncByteStream):
    """A body part of which was read already: those chunks, then the rest as it comes (or the error that cut it)."""

    def __init__(self, chunks: list[bytes], rest: AsyncIterator[bytes] | None, error: httpx.HTTPError | None,
                 inner: httpx.AsyncByteStream) -> None:  # fmt: skip
        self._chunks, self._rest, self._error, self._inner = chunks, rest, error, inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
        if self._error is not None:
            raise self._error
        if self._rest is not None:
            async for chunk in self._rest:
                yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def judge(expected: Decision, decision: Decision) -> str:
    """How `decision` compares with the speculation's: used, blocked, rerouted or changed (another `set` or tags)."""
    action, guess = decision.action, expected.action
    if isinstance(action, Block):
        return "blocked"
    if not isinstance(guess, Route) or action.upstreams[0] != guess.upstreams[0]:
        return "rerouted"
    if dict(decision.params) != dict(expected.params) or dict(decision.tags) != dict(expected.tags):
        return "changed"
    return "used"


def usage(body: bytes, encoding: str) -> dict[str, int] | None:
    """`usage` of a whole answer of any API: chat's and completions' prompt/completion tokens, Responses' and
    Messages' input/output tokens; None when the answer reports none."""
    plain = decoded(body, encoding)
    try:
        data = json.loads(plain) if plain is not None else None
    except ValueError:
        return None
    found = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(found, Mapping):
        return None
    read = found.get("prompt_tokens", found.get("input_tokens"))
    made = found.get("completion_tokens", found.get("output_tokens"))
    if not isinstance(read, int) or not isinstance(made, int):
        return None
    return {"input": read, "output": made}


def _with(d3: D3Decision, record: Mapping[str, Any]) -> D3Decision:
    return dataclasses.replace(d3, overlap=record)
