"""The reverse proxy: a pure-ASGI app in front of OpenAI-compatible chat backends.

    app = create_app(load_config("router.yaml"))       # engine built from the configuration
    uvicorn.run(app)                                    # or `d3router serve router.yaml`

Decided endpoints (router/_apis, one adapter per API): `POST /v1/chat/completions`, `/v1/completions`,
`/v1/responses` and `/v1/messages`, each decided by the policy its `model` names (or `server.default_policy`).
Also `GET /v1/models`, `POST /v1/d3/explain` (a dry run), `GET /healthz`, `GET /readyz`, `GET /metrics`,
`POST /admin/reload` (with the admin token); other `/v1/*` paths only where `server.passthrough` lists them.

With `server.auth`, every path but `/healthz` and `/readyz` needs a client key (`/metrics` its own token when
`server.metrics_token_env` is set, `/admin/reload` the admin token): a request without one is answered 401, in the
API's own shape, before its body is read (router/_faces/auth.py). Then its key's rate limits (429).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from d3backend import DecisionEngine
from policies import Block, Config, UpstreamSettings
from router._apis.body import read_request
from router._apis.chat import Api
from router._apis.registry import API_BY_PATH, error_api
from router._apis.usage import UsageReader, metered
from router._asgi.admission import FULL, Admission
from router._asgi.answer import renaming
from router._asgi.decoding import readable_accept_encoding
from router._asgi.headers import Headers, content_length, encode_headers
from router._asgi.messages import ClientDisconnected, cancel_on_disconnect, drain
from router._asgi.relay import UpstreamBroke, relay
from router._decision.engines import Environ
from router._decision.record import D3Decision
from router._decision.service import After
from router._errors import (
    BadRequest,
    Blocked,
    NoRoute,
    Overloaded,
    RateLimited,
    RequestError,
    Unauthorized,
    UpstreamFailed,
)
from router._faces.auth import Access, Caller
from router._faces.budgets import build_budgets
from router._faces.counting import count_routes
from router._faces.decisions import serve_decisions, serve_systemone
from router._faces.endpoints import Endpoints, send_failure
from router._faces.forward import Failure, Forwarder
from router._faces.guarded import relay_judged
from router._faces.lifecycle import Generation
from router._faces.limits import Pending, build_limiter
from router._faces.overlap import Overlap
from router._faces.parts import build_parts
from router._faces.request import Decided
from router._faces.translated import carry, unsigned
from router._faces.undecided import Undecided
from router._observe import logs, tracing
from router._observe.usage import Accounting, Spent, cost

logger = logging.getLogger(__name__)

UNLIMITED = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes are answered under any load
Handler = Callable[[Scope, Receive, Send, Caller], Awaitable[None]]
PUBLIC = frozenset({"/healthz", "/readyz"})  # answered to anyone: a load balancer has no key
OWN_TOKEN = frozenset({"/metrics", "/admin/reload"})  # their own tokens (server.metrics_token_env, admin_token_env)


class ProxyApp(Endpoints):
    """The ASGI app. Its lifespan starts the engine and closes it and the upstream transport."""

    def __init__(
        self,
        config: Config,
        *,
        engine: DecisionEngine | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        environ: Environ | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self._owns_engine = engine is None
        self.service, self.sessions = build_parts(config, engine, self.environ)
        self.sessions.relays = True  # upstreams called with the router's key: a conversation must be the caller's
        self.access = Access(config, self.environ, self.sessions.salt)
        self.limiter = build_limiter(self.sessions.store, wall_clock)  # wall-clock: replicas share Redis's limits
        self.budgets = build_budgets(self.sessions.store, wall_clock)  # token budgets and rates (issue 29.4)
        self.clock = clock  # /readyz's probe interval
        # Upstream requests go to a transport directly: a proxy needs none of a client's cookies, redirects or
        # auth, and skipping them is a tenth of a proxied request's cost (benchmarks/router.py).
        self.forwarder = Forwarder(self.environ, self.service.metrics, transport)
        self.accounting = Accounting(self.service.metrics)  # the answers' tokens and cost (issue 29.2-3)
        self.overlap = Overlap(self.forwarder, self.sessions, lambda: self.service.metrics)
        self.ready = self.service.engine is None
        self.draining = False  # set on SIGTERM (router._faces.serve): /readyz answers 503 so the load balancer moves on
        self._closed = False
        self._generation, self._retiring, self._reload_lock = Generation(), set(), asyncio.Lock()
        self.admission = Admission(config.server.max_concurrent_requests, config.server.max_buffered_bytes)
        self.on_startup: list[Callable[[], Any]] = []  # run after the engine started (e.g. a file watcher)
        self._background: list[Any] = []
        self.ready_error: str | None = None if self.ready else "the engine has not started"
        self._probed_at: float | None = None
        self._probing = False
        # Every route but the decided endpoints (POST to an `API_BY_PATH` path: `decided`, with its rate check).
        self._routes: dict[tuple[str, str], Handler] = {
            **count_routes(self),  # /v1/messages/count_tokens, /v1/responses/input_tokens (router/_faces/counting.py)
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/d3/explain"): self.explain,
            ("POST", "/v1/decisions"): functools.partial(serve_decisions, self),  # router/_faces/decisions.py
            ("POST", "/v1/systemone"): functools.partial(serve_systemone, self),
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/admin/reload"): self.admin_reload,
        }
        self.undecided = Undecided(self.forwarder, self.sessions, lambda: self.service.snapshot, self._routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        handler = self._routes.get((scope["method"], path))
        api = API_BY_PATH.get(path) if scope["method"] == "POST" else None
        pending = None
        info, token, send = logs.begin(scope, send)  # x-request-id on every response and log line
        generation = self.enter()
        ticket = None
        try:
            caller = Caller("anon:")
            if path == "/v1/d3/explain" and (self._admin(scope) or self._admin(scope, b"x-d3-admin-token")):
                caller = self._explainer(scope)
            elif path not in PUBLIC and path not in OWN_TOKEN:
                try:  # before anything is read (issue 25.1): the key, then its rate
                    caller = self.access.caller(scope["headers"])
                    if api is not None:  # a small body is read while Redis answers (its verdict read in `_decide`)
                        pending = await self.limiter.begin(caller, content_length(scope["headers"]))
                    else:
                        await self.limiter.check(caller)
                except RequestError as exc:
                    if isinstance(exc, Unauthorized):
                        self.service.metrics.request("-", "-", "unauthorized", exc.status)
                    await send_failure(send, exc, error_api(path, scope["headers"]))
                    return
                if info is not None:
                    info.caller = caller.id
            if path not in UNLIMITED:
                ticket = self.admission.enter()
                if ticket is None:  # the refusal in the API's own shape; the body read and dropped, nothing kept
                    self.service.metrics.request("-", "-", "overloaded", 503)
                    await drain(receive, self.config.server.max_body_bytes)
                    await send_failure(send, Overloaded(FULL), error_api(path, scope["headers"]))
                    return
            with ticket or contextlib.nullcontext():
                if api is not None:
                    await self.decided(api, scope, receive, send, caller, pending)
                elif handler is not None:
                    await handler(scope, receive, send, caller)
                elif path.startswith("/v1/"):
                    await self.undecided.passthrough(scope, receive, send, caller)
                else:
                    await send_failure(send, NoRoute(f"no route for {scope['method']} {path}"))
        except ClientDisconnected:
            pass  # gone while sending its body: nothing was started, nothing to answer
        except RequestError as exc:  # raised before any answer started (explain's body over the memory bound)
            await send_failure(send, exc)
        finally:
            if pending is not None:
                pending.drop()  # read already, or the request ended first
            generation.leave()
            logs.end(info, token)

    # --- the decided endpoints ------------------------------------------------------------------------------------
    async def decided(self, api: Api, scope: Scope, receive: Receive, send: Send, caller: Caller,
                      pending: Pending | None = None) -> None:  # fmt: skip
        """A generation request of any API, in its request span (a no-op object when tracing is off); `pending`, its
        rate check still under way (router/_faces/limits.py `RedisLimiter.begin`)."""
        request = Decided(scope, receive, send, api, self.service.snapshot, caller, rate=pending)
        with tracing.request_span(api.name, scope, logs.current()) as request.span:
            try:
                await self._decide(request)
            except RequestError as exc:
                d3 = request.d3
                await request.fail(exc, encode_headers(d3.headers(full=request.debug)) if d3 is not None else None)

    async def _decide(self, request: Decided) -> None:
        """The policy named by `model` (or `server.default_policy`) decides; a route goes upstream."""
        metrics, config = self.service.metrics, request.config
        try:
            request.raw, request.body = await read_request(request.scope, request.receive,
                                                           config.server.max_body_bytes)  # fmt: skip
        except BadRequest as exc:
            await request.admitted()  # over its rate: the 429, whatever its body would get
            metrics.request("-", "-", "invalid", exc.status)
            raise
        try:
            policy = request.pick()
        finally:
            await request.admitted()  # the rate's verdict, before anything is decided, asked or sent
        request.policy = policy
        if policy is None:
            await cancel_on_disconnect(request.receive, lambda: self.undecided.model(request))
            return
        request.request_id = logs.request_id() or request.header(b"x-request-id") or uuid.uuid4().hex
        caller = request.caller.id
        request.turn = turn = self.sessions.turn(request.api, request.scope["headers"], request.body, config,
                                                 caller=caller)  # fmt: skip
        try:  # the caller's budgets, read once: used up, 429; else their share used is the `budget.used` fact
            request.budget_used = await self.budgets.check(request.caller)
        except RateLimited:
            metrics.request(policy.name, "-", "budget", 429)
            raise
        if policy.overlap is not None:  # the upstream starts while the engine decides (router/_faces/overlap.py)
            await cancel_on_disconnect(request.receive, lambda: self.overlap.run(request, self._decided))
            return
        await self._decided(request, turn.route)

    async def _decided(self, request: Decided, after: After) -> None:
        """Decide (`after` changes the decision before it is logged), then answer a block or route; the decision-log
        line is written once the answer's usage is known (or the request ended without one)."""
        metrics, policy = self.service.metrics, request.policy
        if policy is None:  # picked by `_decide`
            raise RuntimeError("a decided request needs its policy")
        facts = {**request.caller.facts, "budget.used": request.budget_used}
        try:
            request.d3 = d3 = await self.service.decide(policy, request.body, request.request_id, api=request.api,
                                                        snapshot=request.snapshot, after=after,
                                                        caller=request.caller.id, caller_facts=facts,
                                                        defer_log=True)  # fmt: skip
        except BadRequest as exc:
            metrics.request(policy.name, "-", "invalid", exc.status)
            raise
        logs.noted(logs.current(), d3)
        # The decision-log line is written once the answer's usage is known (or the request ended without one).
        entry = (
            self.service.log_entry(d3, request.request_id, request.config, request.caller.id)
            if self.service.decision_log is not None
            else None
        )
        try:
            await self._act(request, d3)
        finally:
            if entry is not None:
                if request.spent is not None:
                    entry.update(request.spent.log_fields())
                self.service.write_log(entry)

    async def _act(self, request: Decided, d3: D3Decision) -> None:
        """A block answered in the API's shape; a route sent to its upstreams."""
        metrics = self.service.metrics
        action = d3.decision.action
        if isinstance(action, Block):
            metrics.request(d3.policy, d3.decision.rule, "block", 200 if action.as_answer else action.status)
            # Its message, never its scores; the rule's name only to a caller allowed to debug (issue 25.4).
            raise Blocked(
                action.message,
                status=action.status,
                code=d3.decision.rule if request.debug else None,
                as_answer=action.as_answer,
            )
        if request.speculation is not None:  # watched already (`_decide`)
            await self._route(request, d3, action.upstreams)
            return
        await cancel_on_disconnect(request.receive, lambda: self._route(request, d3, action.upstreams))

    async def _route(self, request: Decided, d3: D3Decision, upstreams: tuple[str, ...]) -> None:
        """Send the decided request to its upstreams in turn: the next on a connect error, a 5xx or a body broken off
        before anything reached the client; the last one's failure is a 502/503/504."""
        metrics, api, turn = self.service.metrics, request.api, request.turn
        failure: Failure = (502, "no upstream was tried")
        tags = encode_headers(d3.decision.tags.items())
        if turn is not None and turn.wants_answer:  # an answer the session reads: in an encoding it can read
            tags += readable_accept_encoding(request.scope["headers"])
        tried = upstreams[0]
        info = logs.current()
        for index, name in enumerate(upstreams):
            tried, upstream = name, request.config.upstreams[name]
            if info is not None:
                info.upstream = name
            with tracing.upstream_span(name, index, upstream.url) as attempt:  # one span per attempt
                payload = api.rewrite(request.raw, request.body, upstream.model, d3.decision.params)
                # The answer's tokens read on its way (issue 29.2): a stream asked for its usage chunk if need be.
                payload, reader = metered(api.name, payload, request.body, upstream.count_usage)
                taken = request.speculation.take(name) if index == 0 and request.speculation is not None else None
                carried = None if taken is not None else carry(api, upstream, payload, request.body, request.raw,
                                                               metrics)  # another API: translated  # fmt: skip
                shown: Headers = []
                if taken is not None:  # the speculative request, started on this route while the engine decided
                    response, failure = await taken
                elif carried is None:
                    payload, shown = unsigned(api, payload, metrics)  # thinking the router made: never sent on
                    response, failure = await self.forwarder.open(
                        api, upstream, name, "POST", api.upstream_path, request.scope, payload, tags
                    )
                else:
                    response, failure = await self.forwarder.open(
                        carried.upstream_api, upstream, name, "POST", carried.path,
                        carried.scope(request.scope, upstream), carried.payload,
                        [*tags, *carried.headers(request.scope["headers"], upstream)],
                    )  # fmt: skip
                if response is None:
                    attempt.set_attribute("error.type", str(failure[0]))
                    continue
                attempt.set_attribute("http.response.status_code", response.status_code)
                if response.status_code >= 500 and index < len(upstreams) - 1:
                    await response.aclose()
                    metrics.upstream_errors[(name, str(response.status_code))] += 1
                    failure = (502, f"upstream {name!r} answered {response.status_code}")
                    continue
                remember = (functools.partial(turn.remember, upstream=name)
                            if turn is not None and turn.wants_answer and response.is_success else None)  # fmt: skip
                try:
                    headers = encode_headers(d3.headers(upstream=name, full=request.debug))
                    if carried is not None:  # the answer in the client's API from here on
                        response, shown = await carried.answer(response, name)
                    headers += shown
                    broke = f"upstream {name!r} broke off its answer"
                    ending = functools.partial(api.stream_error, broke)  # made only if it breaks off
                    rename = renaming(api.answer_model, request.body.get("model"), upstream.model,
                                      request.config.server.answer_model)  # fmt: skip
                    guard = request.policy.answer if request.policy is not None else None
                    if guard is not None and response.is_success:  # judged first (router/_faces/guarded.py)
                        try:
                            await relay_judged(self.service, guard, request, d3, response, headers, name, remember,
                                               rename, reader)  # fmt: skip
                        except Blocked as exc:  # routed, and its answer withheld: counted as the route it took
                            metrics.request(d3.policy, d3.decision.rule, "route", exc.status)
                            raise
                    elif not await relay(response, request.send, headers, name, remember, ending, rename, reader):
                        metrics.upstream_errors[(name, "broken")] += 1
                except UpstreamBroke as exc:  # nothing reached the client yet: the next upstream, or a 502
                    metrics.upstream_errors[(name, "broken")] += 1
                    failure = (502, str(exc))
                    continue
                metrics.request(d3.policy, d3.decision.rule, "route", response.status_code)
                if reader is not None and response.is_success:  # last: the client may leave now (see Budgets.add)
                    await self._spend(request, d3, name, upstream, reader)
                return
        metrics.request(d3.policy, d3.decision.rule, "route", failure[0])
        shown = encode_headers(d3.headers(upstream=tried, full=request.debug))
        await request.fail(UpstreamFailed(failure[1], status=failure[0]), shown)

    async def _spend(self, request: Decided, d3: D3Decision, name: str, upstream: UpstreamSettings,
                     reader: UsageReader) -> None:  # fmt: skip
        """Count what the answer took: tokens and cost in the metrics, kept for the decision-log line, added to the
        caller's budgets and token rates."""
        caller, tokens = request.caller, reader.tokens
        request.spent = spent = Spent(caller.name or "", caller.group or "", d3.policy, d3.decision.rule, name, tokens,
                                      cost(tokens, upstream.price))  # fmt: skip
        self.accounting.count(spent)
        if tokens.reported:
            await self.budgets.spend(caller, tokens.total, spent.cost)


def create_app(config: Config, **kwargs: Any) -> ProxyApp:
    """The proxy app for `config`; see `ProxyApp` for the keyword arguments."""
    return ProxyApp(config, **kwargs)
