"""The reverse proxy: a pure-ASGI app in front of OpenAI-compatible chat backends.

    app = create_app(load_config("router.yaml"))       # engine built from the configuration
    uvicorn.run(app)                                    # or `d3router serve router.yaml`

Decided endpoints (`router/_endpoints.py`, one adapter per API): `POST /v1/chat/completions`, `/v1/completions`,
`/v1/responses` and `/v1/messages`, each decided by the policy its `model` names (or `server.default_policy`).
Also `GET /v1/models`, `POST /v1/d3/explain` (a dry run), `GET /healthz`, `GET /readyz`, `GET /metrics`,
`POST /admin/reload` (with the admin token); other `/v1/*` paths only where `server.passthrough` lists them.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
from starlette.types import Receive, Scope, Send

from d3backend import CachedEngine, DecisionEngine, EngineError, json_bytes
from policies import Block, Config, ConfigError, UpstreamSettings, load_config
from router import _logging, _tracing
from router._apis import CHAT, Api
from router._endpoints import APIS, detect, policy_for, read_request
from router._engines import Environ, start_engine
from router._forward import Failure, Forwarder, allowed, retry_after, unsafe_path
from router._http import (
    BodyTooLarge,
    ClientDisconnected,
    Headers,
    UpstreamBroke,
    cancel_on_disconnect,
    encode_headers,
    read_body,
    relay,
    send_bytes,
    send_error,
    send_json,
)
from router._parts import build_parts
from router._service import D3Decision
from router._sessions import SessionTurn
from router._state import BadRequest

logger = logging.getLogger(__name__)


class ProxyApp:
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
        self.draining = False  # set on SIGTERM (router._serve): /readyz answers 503 so the load balancer moves on
        self._closed = False
        self.on_startup: list[Callable[[], Any]] = []  # run after the engine started (e.g. a file watcher)
        self._background: list[Any] = []
        self.ready_error: str | None = None if self.ready else "the engine has not started"
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Any]] = {
            **{("POST", api.path): functools.partial(self.traced, api) for api in APIS},
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/d3/explain"): self.explain,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/admin/reload"): self.admin_reload,
        }

    @property
    def config(self) -> Config:
        return self.service.config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        handler = self._routes.get((scope["method"], scope["path"]))
        info, token, send = _logging.begin(scope, send)  # x-request-id on every response and log line (issue 14.6)
        try:
            if handler is not None:
                await handler(scope, receive, send)
            elif scope["path"].startswith("/v1/"):
                await self.passthrough(scope, receive, send)
            else:
                await send_error(send, 404, f"no route for {scope['method']} {scope['path']}", "not_found_error")
        except ClientDisconnected:
            pass  # gone while sending its body: nothing was started, nothing to answer
        finally:
            _logging.end(info, token)

    # --- lifespan ------------------------------------------------------------------------------------------------
    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # the server must say why it cannot start, then stop
                    logger.error("d3router cannot start: %s", exc)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Open the decision log, start and probe the engine, run the `on_startup` hooks."""
        self._open_decision_log()
        if self.service.engine is not None:
            await start_engine(self.service.engine)
            await self.check_engine()
        self._background = [hook() for hook in self.on_startup]
        self._background.append(self.service.metrics.follow_engine_pool(self.service.engine))

    def _open_decision_log(self, reopen: bool = False) -> None:
        """Open the configured decision log (a path relative to the configuration file's folder, as model paths
        are); on reload, close the old one and open the new one, or none."""
        if reopen and self.service.decision_log is not None:
            self.service.decision_log.close()
            self.service.decision_log = None
            logger.info("decision log: now %s", self.config.server.decision_log)
        log = self.config.server.decision_log
        if log is not None and self.service.decision_log is None:
            path = Path(self.config.file).parent / log.path
            path.parent.mkdir(parents=True, exist_ok=True)
            self.service.decision_log = open(path, "a", encoding="utf-8")

    async def check_engine(self) -> bool:
        """Probe the engine (one without a probe is taken as ready: its first failure will say otherwise);
        `/readyz` reports the outcome. A failing engine does not stop the router."""
        engine = self.service.engine
        if engine is None:
            return True
        probe = getattr(engine, "probe", None)
        try:
            if probe is not None:
                await probe()
        except EngineError as exc:
            self.ready, self.ready_error = False, str(exc)
            logger.warning("the decision engine is not ready: %s; policies follow on_engine_error", exc)
            return False
        self.ready, self.ready_error = True, None
        return True

    async def __aenter__(self) -> ProxyApp:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close what the app opened; safe to call again."""
        if self._closed:
            return
        self._closed = True
        for task in self._background:
            if hasattr(task, "cancel"):
                task.cancel()
        await self.service.aclose()
        if self._owns_engine and self.service.engine is not None:
            await self.service.engine.aclose()
        await self.forwarder.aclose()
        await self.sessions.store.aclose()
        if self.service.decision_log is not None:
            self.service.decision_log.close()
            self.service.decision_log = None

    # --- the decided endpoints ------------------------------------------------------------------------------------
    async def traced(self, api: Api, scope: Scope, receive: Receive, send: Send) -> None:
        """`decided` in its request span (issue 14.4; a no-op object when tracing is off)."""
        with _tracing.request_span(api.name, scope, _logging.current()):
            await self.decided(api, scope, receive, send)

    async def decided(self, api: Api, scope: Scope, receive: Receive, send: Send) -> None:
        """A generation request of any API: the policy named by `model` (or `server.default_policy`) decides."""
        snapshot = self.service.snapshot  # read once: a reload meanwhile does not change this request's config
        config = snapshot.config
        try:
            raw, body = await read_request(scope, receive, config.server.max_body_bytes)
        except BadRequest as exc:
            self.service.metrics.request("-", "-", "invalid", exc.status)
            await send_json(send, exc.status, api.error(exc.status, exc.message, "invalid_request_error"))
            return
        model = body.get("model")
        try:
            policy = policy_for(config, api, model)
        except BadRequest as exc:  # a policy limited to other APIs
            await send_json(send, exc.status, api.error(exc.status, exc.message, "invalid_request_error", exc.code,
                                                        exc.param))  # fmt: skip
            return
        if policy is None:
            await cancel_on_disconnect(receive, lambda: self._undecided(api, model, scope, send, raw, config))
            return
        request_id = _logging.request_id() or _header(scope, b"x-request-id") or uuid.uuid4().hex
        turn = self.sessions.turn(api, scope["headers"], body, config)
        try:
            d3 = await self.service.decide(policy, body, request_id, api=api, snapshot=snapshot, after=turn.route)
            _logging.noted(_logging.current(), d3)
        except BadRequest as exc:
            self.service.metrics.request(policy.name, "-", "invalid", exc.status)
            error = api.error(exc.status, exc.message, "invalid_request_error", param=exc.param)
            await send_json(send, exc.status, error)
            return
        action = d3.decision.action
        if isinstance(action, Block):
            self.service.metrics.request(policy.name, d3.decision.rule, "block", action.status)
            error = api.error(action.status, action.message, "policy_violation", code=d3.decision.rule)
            await send_json(send, action.status, error, encode_headers(d3.headers()))
            return
        await cancel_on_disconnect(
            receive, lambda: self._route(api, scope, send, raw, body, d3, action.upstreams, config, turn)
        )

    async def _route(
        self, api: Api, scope: Scope, send: Send, raw: bytes, body: dict[str, Any], d3: D3Decision,
        upstreams: tuple[str, ...], config: Config, turn: SessionTurn | None = None,
    ) -> None:  # fmt: skip
        metrics = self.service.metrics
        failure: Failure = (502, "no upstream was tried")
        tags = encode_headers(d3.decision.tags.items())
        tried = upstreams[0]
        info = _logging.current()
        for index, name in enumerate(upstreams):
            tried, upstream = name, config.upstreams[name]
            if info is not None:
                info.upstream = name
            with _tracing.upstream_span(name, index, upstream.url) as attempt:  # one span per attempt (issue 14.4)
                payload = api.rewrite(raw, body, upstream.model, d3.decision.params)
                response, failure = await self.forwarder.open(
                    api, upstream, name, "POST", api.upstream_path, scope, payload, tags
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
                    if not await relay(response, send, encode_headers(d3.headers(upstream=name)), name, remember):
                        metrics.upstream_errors[(name, "broken")] += 1
                except UpstreamBroke as exc:  # nothing reached the client yet: the next upstream, or a 502
                    metrics.upstream_errors[(name, "broken")] += 1
                    failure = (502, str(exc))
                    continue
                metrics.request(d3.policy, d3.decision.rule, "route", response.status_code)
                return
        metrics.request(d3.policy, d3.decision.rule, "route", failure[0])
        error = api.error(failure[0], failure[1], "upstream_error")
        await send_json(
            send, failure[0], error, [*encode_headers(d3.headers(upstream=tried)), *retry_after(failure[0])]
        )

    async def _undecided(self, api: Api, model: Any, scope: Scope, send: Send, raw: bytes, config: Config) -> None:
        """With no `server.default_policy`, a model no policy names goes untouched to the upstream serving it."""
        for name, upstream in config.upstreams.items():
            if isinstance(model, str) and model in (upstream.model, name):
                tag = [(b"x-d3-upstream", name.encode("latin-1", "replace"))]
                await self._as_is(api, name, upstream, "POST", api.upstream_path, scope, raw, send, tag)
                return
        known = sorted({*config.policies, *(u.model for u in config.upstreams.values() if u.model)})
        message = f"the model {model!r} does not exist; available: {', '.join(known)}"
        await send_json(send, 404, api.error(404, message, "invalid_request_error", "model_not_found", "model"))

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Other `/v1/*` requests: those `server.passthrough` lists go to the first upstream as they came (the path
        as the client wrote it, once checked); others get 404."""
        config = self.config
        raw_path = (scope.get("raw_path") or scope["path"].encode("utf-8")).split(b"?")[0]
        problem = unsafe_path(raw_path)
        if problem is not None:
            await send_error(send, 400, f"the path holds {problem}; it is not forwarded", "invalid_request_error")
            return
        if not allowed(scope["path"], config.server.passthrough):
            await send_error(send, 404, f"no route for {scope['method']} {scope['path']}; d3-router forwards only "
                             "the paths server.passthrough lists", "not_found_error")  # fmt: skip
            return
        try:
            raw = await read_body(receive, config.server.max_body_bytes)
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc), "invalid_request_error")
            return
        name, upstream = next(iter(config.upstreams.items()))
        path = raw_path.decode("latin-1").removeprefix("/v1")
        await cancel_on_disconnect(
            receive, lambda: self._as_is(CHAT, name, upstream, scope["method"], path, scope, raw, send, [])
        )

    async def _as_is(
        self, api: Api, name: str, upstream: UpstreamSettings, method: str, path: str, scope: Scope, raw: bytes,
        send: Send, extra: Headers,
    ) -> None:  # fmt: skip
        """Forward an undecided request untouched to one upstream; its failure is a 502/503/504 in `api`'s shape."""
        response, failure = await self.forwarder.open(api, upstream, name, method, path, scope, raw, [])
        if response is not None:
            try:
                await relay(response, send, extra, name)
                return
            except UpstreamBroke as exc:
                failure = (502, str(exc))
        error = api.error(failure[0], failure[1], "upstream_error")
        await send_json(send, failure[0], error, [*extra, *retry_after(failure[0])])

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
            await send_error(send, exc.status, exc.message, "invalid_request_error", param=exc.param)
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
        given = (_header(scope, b"authorization") or "").removeprefix("Bearer ").strip()
        if not token or not hmac.compare_digest(given.encode(), token.encode()):  # no timing hint of the token
            await send_error(send, 403, "reload needs the admin token (server.admin_token_env)", "permission_error")
            return
        ok, message = self.reload()
        await send_json(send, 200 if ok else 422, json.dumps({"reloaded": ok, "message": message}).encode())

    def reload(self) -> tuple[bool, str]:
        """Load the configuration file again and swap it in whole; a broken file keeps the running one."""
        old = self.config
        file = old.file
        try:
            config = load_config(file)
            self.service.swap(config)
        except (ConfigError, RuntimeError) as exc:
            logger.error("reload of %s failed, keeping the running configuration:\n%s", file, exc)
            return False, str(exc)
        if config.engine != old.engine:
            logger.warning("the engine section changed; engine changes take effect on restart")
        if config.server.decision_log != old.server.decision_log:
            self._open_decision_log(reopen=True)
        logger.info("reloaded %s: %d policies", file, len(config.policies))
        return True, f"reloaded {file}"


def create_app(config: Config, **kwargs: Any) -> ProxyApp:
    """The proxy app for `config`; see `ProxyApp` for the keyword arguments."""
    return ProxyApp(config, **kwargs)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None
