"""`D3RouterMiddleware`: d3-router's decisions inside any Starlette or FastAPI app.

    app = FastAPI()
    app.add_middleware(D3RouterMiddleware, config="router.yaml")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        d3 = request.state.d3            # a D3Decision: .decision.action, .decision.rule, .answers, ...

The middleware decides `POST` to the same four paths as the proxy (`/v1/chat/completions`, `/v1/completions`,
`/v1/responses`, `/v1/messages`; `prefix` moves them) before the app sees the request, and is as strict as the
proxy there: a body that is not one JSON object with unique keys, too large, or of another content type gets the
proxy's 4xx in the API's own error shape and never reaches the app; a block is answered with the API's error;
otherwise the request goes on, body unchanged, with the decision at `request.state.d3` and the `x-d3-*` headers and
tags added to the response (by default only those that cannot help a caller probe the guard: see
`D3Decision.headers`). A model no policy names is decided by `server.default_policy`, goes to the app undecided
when `server.undecided_models` lists it, and is refused (404) otherwise. Every other request passes through
untouched.

The caller (issue 25): `caller=` a function of the scope giving its name (None: 401), else the app's own
authentication (`scope["user"]`, as Starlette's AuthenticationMiddleware sets it, placed outside this one), else
`server.auth`'s keys, else a salted hash of the credential the request carries. Its id scopes its sessions and its
decision log line; its key's rate limits apply.
A policy's `overlap:` (issue 31) calls the app at once, while the engine decides, its answer held until the decision is
in (router/_faces/overlapped.py): only for handlers that are safe to start and cancel (docs/overlap.md).
Sessions work as in the proxy (issue 12): a later turn's route is its session's (`d3.session` says new, sticky,
escalated or off), guards still decide every turn, and with `server.redis` the sessions and a second-level decision
cache are shared with the other replicas. The engine starts with the app's lifespan (or on first use).
`settle_gc=True` does at the lifespan's startup what `d3router serve` does (router/_observe/gcpauses.py): start-up's
objects, the app's among them, frozen out of the collector's way and fewer young collections, the pauses in the
middleware's metrics. Off by default: the app's own allocations are not the router's to tune (a higher
generation-0 threshold lets the app's cyclic garbage wait longer, a few megabytes at most).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from d3backend import DecisionEngine
from policies import Block, Config, Policy, load_config
from router._apis.body import read_request
from router._apis.registry import APIS
from router._asgi.admission import FULL, Admission
from router._asgi.decoding import Decoder, FirstResponse, decoded
from router._asgi.headers import encode_headers
from router._asgi.messages import ClientDisconnected, drain, replayed
from router._asgi.relay import BUFFER_LIMIT
from router._decision.engines import start_engine
from router._decision.service import After
from router._errors import Blocked, Overloaded, RequestError, Unauthorized
from router._faces.auth import Access, Caller
from router._faces.guarded import Judging
from router._faces.lifecycle import open_decision_log
from router._faces.limits import build_limiter
from router._faces.overlapped import closed, overlapped
from router._faces.parts import build_parts
from router._faces.request import Decided
from router._observe import gcpauses


class D3RouterMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        config: Config | str | os.PathLike[str],
        engine: DecisionEngine | None = None,
        prefix: str = "/v1",
        caller: Callable[[Scope], str | None] | None = None,
        settle_gc: bool = False,
    ) -> None:
        self.app = app
        self.settle_gc = settle_gc  # opt-in: the app's own objects are frozen too, and its young collections fewer
        self._pauses: gcpauses.Pauses | None = None
        loaded = config if isinstance(config, Config) else load_config(config)
        self._owns_engine = engine is None
        self.service, self.sessions = build_parts(loaded, engine, os.environ)
        self.access = Access(loaded, os.environ, self.sessions.salt)
        self.limiter = build_limiter(self.sessions.store)
        self.identify = caller
        self.apis = {prefix.rstrip("/") + api.path.removeprefix("/v1"): api for api in APIS}
        self.admission = Admission(loaded.server.max_concurrent_requests, loaded.server.max_buffered_bytes)
        self._started = False  # the engine and the decision log: opened with the lifespan, or on first use
        self._start_lock = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        api = self.apis.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if api is None:
            await self.app(scope, receive, send)
            return
        try:
            who = self._caller(scope)
            await self.limiter.check(who)
        except RequestError as exc:  # before the body is read
            await Decided(scope, receive, send, api, self.service.snapshot, Caller("anon:")).fail(exc)
            return
        request = Decided(scope, receive, send, api, self.service.snapshot, who)
        ticket = self.admission.enter()
        if ticket is None:
            await drain(receive, self.service.config.server.max_body_bytes)  # nothing kept: the client reads the 503
            await request.fail(Overloaded(FULL))
            return
        with ticket:  # the body is held until the app has answered
            try:
                policy = await self._read(request)
                if policy is not None and policy.overlap is not None:  # the app starts while the engine decides
                    await overlapped(self, request)  # router/_faces/overlapped.py
                    return
                app_send = request.send if request.turn is None else await self._decision(request, request.turn.route)
            except RequestError as exc:
                d3 = request.d3
                await request.fail(exc, encode_headers(d3.headers(full=request.debug)) if d3 is not None else None)
                return
            except ClientDisconnected:
                return  # gone while sending its body: nothing to decide, no one to answer
            await self._call(request, app_send, replayed(request.raw, receive))

    def _app_scope(self, request: Decided) -> Scope:
        """The scope the app gets: only the router tags its decisions, a client's own x-d3-* headers never reach it."""
        scope = request.scope
        return {**scope, "headers": [(k, v) for k, v in scope["headers"] if not k.startswith(b"x-d3-")]}

    async def _call(self, request: Decided, send: Send, receive: Receive) -> None:
        try:
            await self.app(self._app_scope(request), receive, send)
        finally:
            await closed(send)  # an answer guard still judging is stopped

    async def _read(self, request: Decided) -> Policy | None:
        """Read the body and pick its policy; None: server.undecided_models lists it, the app sees it as it came."""
        config = request.config
        request.raw, request.body = await read_request(request.scope, request.receive, config.server.max_body_bytes)
        request.policy = policy = request.pick()
        if policy is None:
            return None
        await self._start()
        request.turn = self.sessions.turn(request.api, request.scope["headers"], request.body, config,
                                          caller=request.caller.id)  # fmt: skip
        return policy

    async def _decision(self, request: Decided, after: After) -> Send:
        """Decide `request` (`after` changes the decision before it is logged): the `send` the app answers through,
        the decision at `request.state.d3`; a block raises `Blocked`, answered instead."""
        policy, turn = request.policy, request.turn
        if policy is None or turn is None:  # set by `_read`
            raise RuntimeError("a decision needs the request's policy and session turn")
        request.d3 = d3 = await self.service.decide(policy, request.body, api=request.api, snapshot=request.snapshot,
                                                    after=after, caller=request.caller.id,
                                                    caller_facts=request.caller.facts)  # fmt: skip
        action = d3.decision.action
        if isinstance(action, Block):
            raise Blocked(
                action.message,
                status=action.status,
                code=d3.decision.rule if request.debug else None,
                as_answer=action.as_answer,
            )
        request.scope.setdefault("state", {})["d3"] = d3
        headers = encode_headers(d3.headers(full=request.debug))
        replaced = {name for name, _ in headers}
        answer = _Answer() if turn.wants_answer else None
        send = request.send

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in replaced]
                message = {**message, "headers": [*kept, *headers]}
            if answer is not None and answer.see(message):
                # The whole answer, before its last part goes out: the session knows its id before the client can
                # send the next turn, perhaps to another replica (as the proxy's relay does).
                await turn.remember(answer.whole)
            await send(message)

        if policy.answer is not None:  # the app's answer judged before the client has any of it
            return Judging(self.service, policy.answer, request, d3, send_with_headers).send
        return send_with_headers

    def _caller(self, scope: Scope) -> Caller:
        """Who sends the request: the `caller` function's name, the app's authenticated user, a key of
        `server.auth`, or a hash of the credential carried; `Unauthorized` when the function says nobody."""
        if self.identify is not None:
            name = self.identify(scope)
            if not name:
                raise Unauthorized("the app did not authenticate this request")
            return Caller(f"app:{name}", name)
        user = scope.get("user")
        if user is not None and getattr(user, "is_authenticated", False):
            name = str(getattr(user, "identity", None) or getattr(user, "display_name", ""))
            return Caller(f"app:{name}", name)
        return self.access.caller(scope["headers"])

    async def _start(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if not self._started:
                if self.service.decision_log is None:
                    self.service.decision_log = open_decision_log(self.service.config, self.service.metrics)
                await start_engine(self.service.engine)
                self._started = True

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._start()
                if self.settle_gc:  # after the app's own start-up: what it built is frozen with the rest
                    gcpauses.settle()
                    self._pauses = gcpauses.Pauses(self.service.metrics).install()
                    self._pauses.follow()
            elif message["type"] == "lifespan.shutdown":
                if self._pauses is not None:
                    self._pauses.uninstall()
                    self._pauses = None
                await self.service.aclose()
                await self.sessions.store.aclose()
                log, self.service.decision_log = self.service.decision_log, None
                if log is not None:
                    await asyncio.to_thread(log.close)  # every queued line written
                if self._owns_engine and self.service.engine is not None:
                    await self.service.engine.aclose()
            return message

        return wrapped


class _Answer:
    """The app's answer to a Responses turn of a session, so that the session learns the response's id (see
    `SessionTurn.remember`): a whole JSON success (at most `BUFFER_LIMIT` bytes), or a stream's first event carrying
    the response (`response.created`, as soon as it has come), decoded whatever its `Content-Encoding`."""

    def __init__(self) -> None:
        self._parts: list[bytes] | None = []
        self._size = 0
        self._encoding = ""
        self._peek: FirstResponse | None = None
        self.whole = b""

    def see(self, message: Message) -> bool:
        """Keep what `message` adds; True once there is something to read (then it is in `whole`)."""
        if self._parts is None:
            return False
        if message["type"] == "http.response.start":
            headers = {k.lower(): v for k, v in message.get("headers", [])}
            kind = headers.get(b"content-type", b"")
            self._encoding = headers.get(b"content-encoding", b"").decode("latin-1")
            if kind.startswith(b"text/event-stream") and message["status"] < 300:
                self._peek = FirstResponse(Decoder(self._encoding))
            elif message["status"] >= 300 or not kind.startswith(b"application/json"):
                self._parts = None
            return False
        if message["type"] != "http.response.body":
            return False
        chunk = message.get("body", b"")
        if self._peek is not None:
            data = None if self._peek.done else self._peek.feed(chunk)
            if data is None:
                return False
            self.whole = data
            return True
        self._size += len(chunk)
        if self._size > BUFFER_LIMIT:
            self._parts = None
            return False
        self._parts.append(chunk)
        if message.get("more_body", False):
            return False
        whole = decoded(b"".join(self._parts), self._encoding)
        self._parts = None
        if whole is None:
            return False
        self.whole = whole
        return True
