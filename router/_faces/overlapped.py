"""Overlap in the middleware (issue 31): the app's handler starts while the engine decides, and nothing of its answer
reaches the client before the decision is in.

    await overlapped(middleware, request)     # D3RouterMiddleware, for a policy with `overlap:` (after the body)

The expected route is the proxy's (`Expectation`, router/_faces/overlap.py: the session's route, `overlap.route`,
else the default route; `when` as there). The app is called at once with the request as it would get it after that
decision: the body as it came, the client's `x-d3-*` headers dropped, and at `request.state.d3` the expected
decision (its rule, route, tags and `set`; no answers yet, `overlap == {"outcome": "pending"}`). Its answer is held:
`http.response.start` and the body's messages kept, up to `HOLD_LIMIT` bytes; past it the app's `send` waits (its
stream stops being read) until the decision. Then:
  - the decision agrees (`used`: the same route, fallbacks included, the same tags and `set`, so the app got exactly
    what it would have got): `request.state.d3` becomes the decision, what was held is sent with the decision's
    headers (an answer guard judges it as without overlap), then the rest as it comes;
  - a block (`blocked`), another route (`rerouted`), other tags or `set` (`changed`): the app's task is cancelled
    (its `receive` says `http.disconnect`, then it is cancelled), its held answer dropped; a block is answered, a
    route calls the app again with the decided request, as without overlap;
  - the client leaves before the decision (`abandoned`): the decision and the app's task are both cancelled.
The app's handler therefore runs, and is cancelled, for requests that end up blocked: only for handlers that are
safe to start and cancel (docs/overlap.md). A held answer that had come whole and reports `usage` counts its tokens
as wasted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from policies import Decision, Route
from router._apis.state import DecisionState
from router._asgi.messages import replayed
from router._asgi.relay import BUFFER_LIMIT
from router._decision.record import D3Decision
from router._decision.service import After, RouterService
from router._faces.guarded import Judging
from router._faces.overlap import Expectation, counters, judge, usage
from router._faces.request import Decided
from router._sessions.session import Sessions

logger = logging.getLogger(__name__)

HOLD_LIMIT = BUFFER_LIMIT  # bytes of the app's answer held before the decision; past it, the app's `send` waits


class Middleware(Protocol):
    """What `overlapped` reads of `D3RouterMiddleware`."""

    app: ASGIApp
    service: RouterService
    sessions: Sessions

    async def _decision(self, request: Decided, after: After) -> Send: ...

    def _app_scope(self, request: Decided) -> Scope: ...

    async def _call(self, request: Decided, send: Send, receive: Receive) -> None: ...


async def closed(send: Send) -> None:
    """The app answered through `send`: an answer guard's judging (`Judging.send`) still running is stopped."""
    judging = getattr(send, "__self__", None)
    if isinstance(judging, Judging):
        await judging.aclose()


class Held:
    """The app's answer while the decision is pending: its messages kept (at most `limit` body bytes, then `send`
    waits), sent on by `release` in order, then passed through; dropped by `drop`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.messages: list[Message] = []
        self.size = 0
        self._out: Send | None = None
        self._dropped = False
        self._room = asyncio.Event()  # set once released or dropped: a waiting `send` goes on
        self._lock = asyncio.Lock()

    async def send(self, message: Message) -> None:
        if self._out is None and not self._dropped and self.size > self.limit:
            await self._room.wait()  # back-pressure: the app's stream is not read until the decision
        async with self._lock:
            if self._out is not None:
                await self._out(message)
            elif not self._dropped:
                self.messages.append(message)
                if message["type"] == "http.response.body":
                    self.size += len(message.get("body", b""))

    async def release(self, send: Send) -> None:
        async with self._lock:
            messages, self.messages = self.messages, []
            for message in messages:
                await send(message)
            self._out = send
        self._room.set()

    def drop(self) -> None:
        self._dropped = True
        self._room.set()

    def whole(self) -> tuple[int, str, bytes] | None:
        """The held answer's status, content coding and body, if it had come whole."""
        if not self.messages or self.messages[0]["type"] != "http.response.start":
            return None
        last = self.messages[-1]
        if last["type"] != "http.response.body" or last.get("more_body", False):
            return None
        start = self.messages[0]
        headers = {k.lower(): v for k, v in start.get("headers", [])}
        body = b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")
        return start["status"], headers.get(b"content-encoding", b"").decode("latin-1"), body


class Client:
    """The client's side once its body is read: one task reads `receive` (only `http.disconnect` can come now), and
    each app call's `receive` replays the body, then says `http.disconnect` when the client left or the call was
    cancelled."""

    def __init__(self, receive: Receive) -> None:
        self.left = asyncio.Event()
        self._gone: list[asyncio.Event] = []
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left.set()
        for gone in self._gone:
            gone.set()

    def receive(self, body: bytes) -> tuple[Receive, asyncio.Event]:
        """An app call's `receive`, and the event that ends it (set on the client's leaving, or by a cancel)."""
        gone = asyncio.Event()
        if self.left.is_set():
            gone.set()
        self._gone.append(gone)

        async def disconnect() -> Message:
            await gone.wait()
            return {"type": "http.disconnect"}

        return replayed(body, disconnect), gone

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.wait([self._task])
        if not self._task.cancelled() and self._task.exception() is not None:  # retrieved: the request is over
            logger.debug("reading the client's receive failed", exc_info=self._task.exception())


class AppSpeculation(Expectation):
    """One request's app call started before its decision: held, then released or cancelled."""

    def __init__(self, middleware: Middleware, request: Decided, client: Client) -> None:
        super().__init__(middleware.sessions, lambda: middleware.service.metrics, request)
        self.middleware = middleware
        self.client = client
        self.held = Held(HOLD_LIMIT)
        self.state: dict[str, Any] = {}  # the speculative call's `scope["state"]`
        self.task: asyncio.Task[None] | None = None
        self._gone: asyncio.Event | None = None

    @property
    def started(self) -> bool:
        return self.task is not None

    async def start(self) -> None:
        """Call the app on the expected route, when the policy's `when` allows."""
        if await self.expect() is None or self.expected is None:
            return
        request, middleware = self.request, self.middleware
        scope = middleware._app_scope(request)
        self.state = {**scope.get("state", {}), "d3": provisional(self.policy.name, self.expected)}
        receive, self._gone = self.client.receive(request.raw)
        counters(self.metrics()).started[self.policy.name] += 1
        self.task = asyncio.ensure_future(middleware.app({**scope, "state": self.state}, receive, self.held.send))

    def judge(self, expected: Decision, decision: Decision) -> str:
        """The proxy's judgement, and the whole route: the app saw the expected decision's fallbacks too."""
        outcome = judge(expected, decision)
        action, guess = decision.action, expected.action
        if outcome == "used" and isinstance(action, Route) and isinstance(guess, Route):
            return "used" if action.upstreams == guess.upstreams else "rerouted"
        return outcome

    async def cancel(self) -> None:
        """Tell the app's call the client is gone, cancel it and drop what it answered (idempotent)."""
        task = self.task
        if task is None:
            return
        if self._gone is not None:
            self._gone.set()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            logger.debug("a cancelled speculative app call had failed", exc_info=task.exception())
        self.held.drop()

    def _wasted(self) -> dict[str, int] | None:
        whole = self.held.whole()
        if whole is None or not 200 <= whole[0] < 300:
            return None
        return usage(whole[2], whole[1])

    async def release(self, send: Send) -> None:
        """The decision agreed: the app's call goes on with the decision at `request.state.d3`, its answer sent."""
        task = self.task
        if task is None:
            raise RuntimeError("release needs a started speculation")
        self.state["d3"] = self.request.d3
        await self.held.release(send)
        await task


def provisional(policy: str, expected: Decision) -> D3Decision:
    """What the app's speculative call sees at `request.state.d3`: the expected decision, no answers yet."""
    return D3Decision(policy, expected, {}, DecisionState(None), 0.0, False, overlap={"outcome": "pending"})


async def overlapped(middleware: Middleware, request: Decided) -> None:
    """Decide `request` while the app's call runs on the expected route; then release it, answer the block (raised:
    `Blocked`, after the call was cancelled) or call the app again with the decided request."""
    client = Client(request.receive)
    speculation = AppSpeculation(middleware, request, client)
    decision: asyncio.Task[Send] | None = None
    try:
        await speculation.start()
        decision = asyncio.ensure_future(middleware._decision(request, speculation.after))
        left = asyncio.ensure_future(client.left.wait())
        try:
            await asyncio.wait([decision, left], return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            await asyncio.wait([left])
        if not decision.done():  # the client left first: nothing to answer
            return
        send = decision.result()  # a block or a failure raises, the call cancelled already
        if speculation.outcome == "used":
            try:
                await speculation.release(send)
            finally:
                await closed(send)
            return
        receive, _ = client.receive(request.raw)
        await middleware._call(request, send, receive)
    finally:
        if decision is not None and not decision.done():
            decision.cancel()
            await asyncio.wait([decision])
        await speculation.discard()
        await client.aclose()
