"""The reverse proxy: a pure-ASGI app in front of OpenAI-compatible chat backends.

    app = create_app(load_config("router.yaml"))       # engine built from the configuration
    uvicorn.run(app)                                    # or `d3router serve router.yaml`

Decided endpoints (router/_apis, one adapter per API): `POST /v1/chat/completions`, `/v1/completions`,
`/v1/responses` and `/v1/messages`, each decided by the policy its `model` names (or `server.default_policy`).
Also `GET /v1/models`, `POST /v1/d3/explain` (a dry run), `GET /healthz`, `GET /readyz`, `GET /metrics`,
`POST /admin/reload` (with the admin token); other `/v1/*` paths only where `server.passthrough` lists them.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
from starlette.types import Receive, Scope, Send

from d3backend import CachedEngine, DecisionEngine, json_bytes
from policies import Block, Config, UpstreamSettings
from router._apis.body import read_request
from router._apis.chat import CHAT, Api
from router._apis.registry import API_BY_PATH, APIS, detect
from router._asgi.admission import Admission
from router._asgi.headers import Headers, content_length, encode_headers, header
from router._asgi.messages import ClientDisconnected, cancel_on_disconnect, drain, read_body, send_bytes, send_json
from router._asgi.relay import UpstreamBroke, relay
from router._decision.engines import Environ
from router._decision.pick import policy_for
from router._decision.record import D3Decision
from router._errors import (
    BadRequest,
    Blocked,
    Forbidden,
    ModelNotFound,
    NoRoute,
    Overloaded,
    RequestError,
    UpstreamFailed,
    answer,
)
from router._faces.decisions import serve_decisions, serve_systemone
from router._faces.forward import Failure, Forwarder, allowed, unsafe_path
from router._faces.lifecycle import Generation, Lifecycle
from router._faces.parts import build_parts
from router._faces.request import Decided
from router._observe import logs, tracing

logger = logging.getLogger(__name__)

UNLIMITED = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes are answered under any load


class ProxyApp(Lifecycle):
    """The ASGI app. Its lifespan starts the engine and closes it and the upstream transport."""

    def __init__(
        self,
        config: Config,
        *,
        engine: DecisionEngine | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        environ: Environ | None = None,
    ) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self._owns_engine = engine is None
        self.service, self.sessions = build_parts(config, engine, self.environ)
        # Upstream requests go to a transport directly: a proxy needs none of a client's cookies, redirects or
        # auth, and skipping them is a tenth of a proxied request's cost (benchmarks/router.py).
        self.forwarder = Forwarder(self.environ, self.service.metrics, transport)
        self.ready = self.service.engine is None
        self.draining = False  # set on SIGTERM (router._faces.serve): /readyz answers 503 so the load balancer moves on
        self._closed = False
        self._generation, self._retiring = Generation(), set()
        self.admission = Admission(config.server.max_concurrent_requests, config.server.max_buffered_bytes)
        self.on_startup: list[Callable[[], Any]] = []  # run after the engine started (e.g. a file watcher)
        self._background: list[Any] = []
        self.ready_error: str | None = None if self.ready else "the engine has not started"
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Any]] = {
            **{("POST", api.path): functools.partial(self.decided, api) for api in APIS},
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/d3/explain"): self.explain,
            ("POST", "/v1/decisions"): functools.partial(serve_decisions, self),  # router/_faces/decisions.py
            ("POST", "/v1/systemone"): functools.partial(serve_systemone, self),
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/admin/reload"): self.admin_reload,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        handler = self._routes.get((scope["method"], scope["path"]))
        info, token, send = logs.begin(scope, send)  # x-request-id on every response and log line
        generation = self.enter()
        ticket = None if scope["path"] in UNLIMITED else self.admission.enter()
        try:
            if ticket is None and scope["path"] not in UNLIMITED:
                api = API_BY_PATH.get(scope["path"], CHAT)  # the refusal in the API's own shape
                self.service.metrics.request("-", "-", "overloaded", 503)
                await drain(receive, self.config.server.max_body_bytes)  # nothing kept: the client reads the 503
                status, body, headers = answer(
                    Overloaded(
                        "the router serves as many requests as it may (server.max_concurrent_requests); retry shortly"
                    ),
                    api,
                )
                await send_json(send, status, body, headers)
                return
            with ticket or contextlib.nullcontext():
                if handler is not None:
                    await handler(scope, receive, send)
                elif scope["path"].startswith("/v1/"):
                    await self.passthrough(scope, receive, send)
                else:
                    await _fail(send, NoRoute(f"no route for {scope['method']} {scope['path']}"))
        except ClientDisconnected:
            pass  # gone while sending its body: nothing was started, nothing to answer
        except RequestError as exc:  # raised before any answer started (explain's body over the memory bound)
            await _fail(send, exc)
        finally:
            generation.leave()
            logs.end(info, token)

    # --- the decided endpoints ------------------------------------------------------------------------------------
    async def decided(self, api: Api, scope: Scope, receive: Receive, send: Send) -> None:
        """A generation request of any API, in its request span (a no-op object when tracing is off)."""
        request = Decided(scope, receive, send, api, self.service.snapshot)
        with tracing.request_span(api.name, scope, logs.current()) as request.span:
            try:
                await self._decide(request)
            except RequestError as exc:
                await request.fail(exc, encode_headers(request.d3.headers()) if request.d3 is not None else None)

    async def _decide(self, request: Decided) -> None:
        """The policy named by `model` (or `server.default_policy`) decides; a route goes upstream."""
        metrics, config = self.service.metrics, request.config
        try:
            request.raw, request.body = await read_request(request.scope, request.receive,
                                                           config.server.max_body_bytes)  # fmt: skip
        except BadRequest as exc:
            metrics.request("-", "-", "invalid", exc.status)
            raise
        request.policy = policy = policy_for(config, request.api, request.body.get("model"))
        if policy is None:
            await cancel_on_disconnect(request.receive, lambda: self._undecided(request))
            return
        request.request_id = logs.request_id() or request.header(b"x-request-id") or uuid.uuid4().hex
        request.turn = turn = self.sessions.turn(request.api, request.scope["headers"], request.body, config)
        try:
            request.d3 = d3 = await self.service.decide(policy, request.body, request.request_id, api=request.api,
                                                        snapshot=request.snapshot, after=turn.route)  # fmt: skip
        except BadRequest as exc:
            metrics.request(policy.name, "-", "invalid", exc.status)
            raise
        logs.noted(logs.current(), d3)
        action = d3.decision.action
        if isinstance(action, Block):
            metrics.request(policy.name, d3.decision.rule, "block", action.status)
            raise Blocked(action.message, status=action.status, code=d3.decision.rule)
        await cancel_on_disconnect(request.receive, lambda: self._route(request, d3, action.upstreams))

    async def _route(self, request: Decided, d3: D3Decision, upstreams: tuple[str, ...]) -> None:
        """Send the decided request to its upstreams in turn: the next on a connect error, a 5xx or a body broken off
        before anything reached the client; the last one's failure is a 502/503/504."""
        metrics, api, turn = self.service.metrics, request.api, request.turn
        failure: Failure = (502, "no upstream was tried")
        tags = encode_headers(d3.decision.tags.items())
        tried = upstreams[0]
        info = logs.current()
        for index, name in enumerate(upstreams):
            tried, upstream = name, request.config.upstreams[name]
            if info is not None:
                info.upstream = name
            with tracing.upstream_span(name, index, upstream.url) as attempt:  # one span per attempt
                payload = api.rewrite(request.raw, request.body, upstream.model, d3.decision.params)
                response, failure = await self.forwarder.open(
                    api, upstream, name, "POST", api.upstream_path, request.scope, payload, tags
                )
                if response is None:
                    attempt.set_attribute("error.type", str(failure[0]))
                    continue
                attempt.set_attribute("http.response.status_code", response.status_code)
                if response.status_code >= 500 and index < len(upstreams) - 1:
                    await response.aclose()
                    metrics.upstream_errors[(name, str(response.status_code))] += 1
                    failure = (502, f"upstream {name!r} answered {response.status_code}")
                    continue
                remember = turn.remember if turn is not None and turn.wants_answer and response.is_success else None
                try:
                    headers = encode_headers(d3.headers(upstream=name))
                    if not await relay(response, request.send, headers, name, remember):
                        metrics.upstream_errors[(name, "broken")] += 1
                except UpstreamBroke as exc:  # nothing reached the client yet: the next upstream, or a 502
                    metrics.upstream_errors[(name, "broken")] += 1
                    failure = (502, str(exc))
                    continue
                metrics.request(d3.policy, d3.decision.rule, "route", response.status_code)
                return
        metrics.request(d3.policy, d3.decision.rule, "route", failure[0])
        await request.fail(UpstreamFailed(failure[1], status=failure[0]), encode_headers(d3.headers(upstream=tried)))

    async def _undecided(self, request: Decided) -> None:
        """With no `server.default_policy`, a model no policy names goes untouched to the upstream serving it."""
        model, config = request.body.get("model"), request.config
        for name, upstream in config.upstreams.items():
            if isinstance(model, str) and model in (upstream.model, name):
                tag = [(b"x-d3-upstream", name.encode("latin-1", "replace"))]
                await self._as_is(request, name, upstream, "POST", request.api.upstream_path, tag)
                return
        known = sorted({*config.policies, *(u.model for u in config.upstreams.values() if u.model)})
        await request.fail(ModelNotFound(f"the model {model!r} does not exist; available: {', '.join(known)}"))

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Other `/v1/*` requests: those `server.passthrough` lists go to the first upstream as they came (the path
        as the client wrote it, once checked); others get 404. Errors are OpenAI-shaped (the house default)."""
        request = Decided(scope, receive, send, CHAT, self.service.snapshot)
        config = request.config
        raw_path = (scope.get("raw_path") or scope["path"].encode("utf-8")).split(b"?")[0]
        try:
            problem = unsafe_path(raw_path)
            if problem is not None:
                raise BadRequest(f"the path holds {problem}; it is not forwarded")
            if not allowed(scope["path"], config.server.passthrough):
                raise NoRoute(f"no route for {scope['method']} {scope['path']}; d3-router forwards only the paths "
                              "server.passthrough lists")  # fmt: skip
            request.raw = await read_body(receive, config.server.max_body_bytes, content_length(scope["headers"]))
        except RequestError as exc:
            await request.fail(exc)
            return
        name, upstream = next(iter(config.upstreams.items()))
        path = raw_path.decode("latin-1").removeprefix("/v1")
        await cancel_on_disconnect(receive, lambda: self._as_is(request, name, upstream, scope["method"], path, []))

    async def _as_is(
        self, request: Decided, name: str, upstream: UpstreamSettings, method: str, path: str, extra: Headers
    ) -> None:
        """Forward an undecided request untouched to one upstream; its failure is a 502/503/504 in its API's shape."""
        response, failure = await self.forwarder.open(request.api, upstream, name, method, path, request.scope,
                                                      request.raw, [])  # fmt: skip
        if response is not None:
            try:
                await relay(response, request.send, extra, name)
                return
            except UpstreamBroke as exc:
                failure = (502, str(exc))
        await request.fail(UpstreamFailed(failure[1], status=failure[0]), extra)

    # --- the other endpoints -------------------------------------------------------------------------------------
    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        created = int(time.time())
        data = [{"id": name, "object": "model", "created": created, "owned_by": "d3-router"}
                for name in self.config.policies]  # fmt: skip
        seen = set(self.config.policies)
        for upstream_name, upstream in self.config.upstreams.items():
            if upstream.model and upstream.model not in seen:
                seen.add(upstream.model)
                data.append({"id": upstream.model, "object": "model", "created": created, "owned_by": upstream_name})
        await send_json(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def explain(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A dry run for a body of any decided API (`?api=chat|completions|responses|messages`, else guessed from
        its fields): state, questions, answers and rule trace; no upstream is called."""
        try:
            _, body = await read_request(scope, receive, self.config.server.max_body_bytes)
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            api = detect(body, (query.get("api") or [None])[0])
            turn = self.sessions.turn(api, scope["headers"], body, self.config, dry=True)
            payload = await self.service.explain(body, api, after=turn.route)
        except BadRequest as exc:
            await _fail(send, exc)
            return
        await send_json(send, 200, json_bytes(payload))

    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, b'{"status":"ok"}')

    async def readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Ready while the engine answers: each call probes it (one small request; probes are not cached).
        Not ready while draining for shutdown, whatever the engine says."""
        if self.draining:
            await send_json(send, 503, b'{"status":"not ready","reason":"draining: the router is shutting down"}')
            return
        await self.check_engine()
        if self.ready:
            await send_json(send, 200, b'{"status":"ready"}')
        else:
            body = json.dumps({"status": "not ready", "reason": self.ready_error})
            await send_json(send, 503, body.encode())

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        engine = self.service.engine
        if isinstance(engine, CachedEngine):
            self.service.metrics.cache_entries = engine.stats.size
        self.service.metrics.engine_pool(engine)
        await send_bytes(send, 200, self.service.metrics.render().encode(), [], b"text/plain; version=0.0.4")

    async def admin_reload(self, scope: Scope, receive: Receive, send: Send) -> None:
        env = self.config.server.admin_token_env
        token = self.environ.get(env, "") if env else ""
        given = (header(scope["headers"], b"authorization") or b"").decode("latin-1").removeprefix("Bearer ").strip()
        if not token or not hmac.compare_digest(given.encode(), token.encode()):  # no timing hint of the token
            await _fail(send, Forbidden("reload needs the admin token (server.admin_token_env)"))
            return
        done = await self.areload()
        result: dict[str, Any] = {"reloaded": done.ok, "message": done.message}
        if done.restart:
            result["restart_needed"] = list(done.restart)
        await send_json(send, 200 if done.ok else 422, json.dumps(result).encode())


def create_app(config: Config, **kwargs: Any) -> ProxyApp:
    """The proxy app for `config`; see `ProxyApp` for the keyword arguments."""
    return ProxyApp(config, **kwargs)


async def _fail(send: Send, exc: RequestError) -> None:
    """An error on a path of no client API, in the OpenAI shape (the house default)."""
    status, body, headers = answer(exc, CHAT)
    await send_json(send, status, body, headers)
