"""The reverse proxy: a pure-ASGI app in front of OpenAI-compatible chat backends.

    app = create_app(load_config("router.yaml"))       # engine built from the configuration
    uvicorn.run(app)                                    # or `d3router serve router.yaml`

Endpoints: `POST /v1/chat/completions` (decided by the policy named by `model`; other models pass through to the
upstream serving them), `GET /v1/models`, `POST /v1/d3/explain` (a dry run), `GET /healthz`, `GET /readyz`,
`GET /metrics`, `POST /admin/reload` (with the admin token), and any other `/v1/*` request passed through to
the first upstream.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from d3backend import (
    CachedEngine,
    DecisionEngine,
    EmbeddedEngine,
    EngineError,
    json_bytes,
    make_transport,
    outbound_request,
)
from policies import Block, Config, ConfigError, UpstreamSettings, load_config
from router._engines import Environ, build_engine
from router._http import (
    NOT_FORWARDED_RAW,
    BodyTooLarge,
    ClientDisconnected,
    Headers,
    cancel_on_disconnect,
    encode_headers,
    read_body,
    relay,
    send_bytes,
    send_error,
    send_json,
)
from router._service import D3Decision, RouterService
from router._state import BadChatRequest

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
        needs_engine = any(policy.questions for policy in config.policies.values())
        if engine is None and needs_engine:
            engine = build_engine(config.engine, base_dir=Path(config.file).parent, environ=self.environ)
        self.service = RouterService(config, engine)
        # Upstream requests go to the transport directly: a proxy needs none of a client's cookies, redirects or
        # auth, and skipping them is a tenth of a proxied request's cost (benchmarks/router.py).
        self._owns_transport = transport is None
        self.transport = transport or make_transport()
        self.ready = engine is None
        self.draining = False  # set on SIGTERM (router._serve): /readyz answers 503 so the load balancer moves on
        self._closed = False
        self.on_startup: list[Callable[[], Any]] = []  # run after the engine started (e.g. a file watcher)
        self._background: list[Any] = []
        self.ready_error: str | None = None if self.ready else "the engine has not started"
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Any]] = {
            ("POST", "/v1/chat/completions"): self.chat,
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
        try:
            if handler is not None:
                await handler(scope, receive, send)
            elif scope["path"].startswith("/v1/"):
                await self.passthrough(scope, receive, send)
            else:
                await send_error(send, 404, f"no route for {scope['method']} {scope['path']}", "not_found_error")
        except ClientDisconnected:
            pass  # gone while sending its body: nothing was started, nothing to answer

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
        log = self.config.server.decision_log
        if log is not None and self.service.decision_log is None:
            path = Path(log.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.service.decision_log = open(path, "a", encoding="utf-8")
        engine = self.service.engine
        if engine is not None:
            inner = engine.engine if isinstance(engine, CachedEngine) else engine
            if isinstance(inner, EmbeddedEngine):
                await inner.start()
            await self.check_engine()
        self._background = [hook() for hook in self.on_startup]

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

    async def aclose(self) -> None:
        """Close what the app opened; safe to call again."""
        if self._closed:
            return
        self._closed = True
        for task in self._background:
            if hasattr(task, "cancel"):
                task.cancel()
        if self._owns_engine and self.service.engine is not None:
            await self.service.engine.aclose()
        if self._owns_transport:
            await self.transport.aclose()
        if self.service.decision_log is not None:
            self.service.decision_log.close()
            self.service.decision_log = None

    # --- chat ------------------------------------------------------------------------------------------------------
    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        parsed = await self._read_chat(scope, receive, send)
        if parsed is None:
            return
        raw, body = parsed
        config = self.config
        model = body.get("model")
        policy = config.policies.get(model) if isinstance(model, str) else None
        if policy is None:
            await cancel_on_disconnect(receive, lambda: self._passthrough_model(model, scope, send, raw))
            return
        request_id = "" if self.service.decision_log is None else _header(scope, b"x-request-id") or uuid.uuid4().hex
        try:
            d3 = await self.service.decide(policy, body, request_id)
        except BadChatRequest as exc:
            self.service.metrics.request(policy.name, "-", "invalid", 400)
            await send_error(send, 400, exc.message, "invalid_request_error", param=exc.param)
            return
        action = d3.decision.action
        if isinstance(action, Block):
            self.service.metrics.request(policy.name, d3.decision.rule, "block", action.status)
            await send_error(
                send, action.status, action.message, "policy_violation", code=d3.decision.rule,
                headers=encode_headers(d3.headers()),
            )  # fmt: skip
            return
        await cancel_on_disconnect(receive, lambda: self._route(scope, send, raw, body, d3, action.upstreams))

    async def _read_chat(self, scope: Scope, receive: Receive, send: Send) -> tuple[bytes, dict[str, Any]] | None:
        limit = self.config.server.max_body_bytes
        try:
            raw = await read_body(receive, limit)
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc), "invalid_request_error")
            return None
        content_type = (_header(scope, b"content-type") or "application/json").split(";")[0].strip().lower()
        if content_type != "application/json":
            await send_error(send, 415, f"expected content-type application/json, found {content_type!r}",
                             "invalid_request_error")  # fmt: skip
            return None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            reason = "invalid UTF-8" if isinstance(exc, UnicodeDecodeError) else "invalid JSON"
            await send_error(send, 400, f"the request body is not a JSON object: {reason}", "invalid_request_error")
            return None
        if not isinstance(body, dict):
            await send_error(send, 400, "the request body must be a JSON object", "invalid_request_error")
            return None
        return raw, body

    async def _route(
        self, scope: Scope, send: Send, raw: bytes, body: dict[str, Any], d3: D3Decision, upstreams: tuple[str, ...]
    ) -> None:
        config = self.config
        failure: tuple[int, str] = (502, "no upstream was tried")
        tags = encode_headers(d3.decision.tags.items())
        for index, name in enumerate(upstreams):
            upstream = config.upstreams[name]
            payload = _rewrite(raw, body, upstream.model, d3.decision.params)
            response, failure = await self._open(upstream, name, "POST", "/chat/completions", scope, payload, tags)
            if response is None:
                continue
            last = index == len(upstreams) - 1
            if response.status_code >= 500 and not last:
                await response.aclose()
                self.service.metrics.upstream_errors[(name, str(response.status_code))] += 1
                failure = (502, f"upstream {name!r} answered {response.status_code}")
                continue
            self.service.metrics.request(d3.policy, d3.decision.rule, "route", response.status_code)
            await relay(response, send, encode_headers(d3.headers(upstream=name)))
            return
        self.service.metrics.request(d3.policy, d3.decision.rule, "route", failure[0])
        await send_error(send, failure[0], failure[1], "upstream_error", headers=encode_headers(d3.headers()))

    async def _open(
        self, upstream: UpstreamSettings, name: str, method: str, path: str, scope: Scope, payload: bytes,
        extra: Headers,
    ) -> tuple[httpx.Response | None, tuple[int, str]]:  # fmt: skip
        """Send the request upstream and wait for its response headers; a failure is (None, (status, message))."""
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in NOT_FORWARDED_RAW]
        if upstream.api_key_env:
            key = self.environ.get(upstream.api_key_env, "")
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", f"Bearer {key}".encode("latin-1", "replace")))
        headers += extra
        request = outbound_request(
            method, upstream.url + path, headers=headers, content=payload, timeout_s=upstream.timeout_s,
            connect_timeout_s=upstream.connect_timeout_s, query=scope.get("query_string", b""),
        )  # fmt: skip
        start = time.perf_counter()
        try:
            response = await self.transport.handle_async_request(request)
        except httpx.TimeoutException:
            self.service.metrics.upstream_errors[(name, "timeout")] += 1
            return None, (504, f"upstream {name!r} did not answer within {upstream.timeout_s:g} s")
        except httpx.TransportError as exc:
            self.service.metrics.upstream_errors[(name, "connect")] += 1
            return None, (502, f"cannot reach upstream {name!r}: {type(exc).__name__}")
        self.service.metrics.upstream_seconds[name].observe(time.perf_counter() - start)
        return response, (response.status_code, "")

    async def _passthrough_model(self, model: Any, scope: Scope, send: Send, raw: bytes) -> None:
        """A model no policy names goes to the upstream that serves it, untouched."""
        for name, upstream in self.config.upstreams.items():
            if isinstance(model, str) and model in (upstream.model, name):
                response, failure = await self._open(upstream, name, "POST", "/chat/completions", scope, raw, [])
                if response is None:
                    await send_error(send, failure[0], failure[1], "upstream_error")
                    return
                await relay(response, send, [(b"x-d3-upstream", name.encode("latin-1", "replace"))])
                return
        known = sorted({*self.config.policies, *(u.model for u in self.config.upstreams.values() if u.model)})
        await send_error(
            send, 404, f"the model {model!r} does not exist; available: {', '.join(known)}", "invalid_request_error",
            code="model_not_found", param="model",
        )  # fmt: skip

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Other `/v1/*` requests go to the first upstream as they came."""
        try:
            raw = await read_body(receive, self.config.server.max_body_bytes)
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc), "invalid_request_error")
            return
        name, upstream = next(iter(self.config.upstreams.items()))
        path = scope["path"].removeprefix("/v1")

        async def forward() -> None:
            response, failure = await self._open(upstream, name, scope["method"], path, scope, raw, [])
            if response is None:
                await send_error(send, failure[0], failure[1], "upstream_error")
                return
            await relay(response, send, [])

        await cancel_on_disconnect(receive, forward)

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
        parsed = await self._read_chat(scope, receive, send)
        if parsed is None:
            return
        _, body = parsed
        model = body.get("model")
        policy = self.config.policies.get(model) if isinstance(model, str) else None
        if policy is None:
            await send_error(send, 404, f"no policy is named {model!r}; explain needs a policy's model name",
                             "invalid_request_error", param="model")  # fmt: skip
            return
        try:
            d3 = await self.service.decide(policy, body)
        except BadChatRequest as exc:
            await send_error(send, 400, exc.message, "invalid_request_error", param=exc.param)
            return
        payload = d3.explain()
        payload["questions"] = {qid: question.to_wire() for qid, question in policy.questions.items()}
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
        await send_bytes(send, 200, self.service.metrics.render().encode(), [], b"text/plain; version=0.0.4")

    async def admin_reload(self, scope: Scope, receive: Receive, send: Send) -> None:
        env = self.config.server.admin_token_env
        token = self.environ.get(env, "") if env else ""
        given = (_header(scope, b"authorization") or "").removeprefix("Bearer ").strip()
        if not token or given != token:
            await send_error(send, 403, "reload needs the admin token (server.admin_token_env)", "permission_error")
            return
        ok, message = self.reload()
        await send_json(send, 200 if ok else 422, json.dumps({"reloaded": ok, "message": message}).encode())

    def reload(self) -> tuple[bool, str]:
        """Load the configuration file again and swap it in whole; a broken file keeps the running one."""
        file = self.config.file
        try:
            config = load_config(file)
            self.service.swap(config)
        except (ConfigError, RuntimeError) as exc:
            logger.error("reload of %s failed, keeping the running configuration:\n%s", file, exc)
            return False, str(exc)
        if config.engine != self.config.engine:
            logger.warning("the engine section changed; engine changes take effect on restart")
        logger.info("reloaded %s: %d policies", file, len(config.policies))
        return True, f"reloaded {file}"


def create_app(config: Config, **kwargs: Any) -> ProxyApp:
    """The proxy app for `config`; see `ProxyApp` for the keyword arguments."""
    return ProxyApp(config, **kwargs)


def _rewrite(raw: bytes, body: dict[str, Any], model: str | None, params: Mapping[str, Any]) -> bytes:
    """The client's bytes unless the route rewrites the model or a rule sets parameters."""
    if not params and (model is None or body.get("model") == model):
        return raw
    changed = {**body, **params}
    if model is not None:
        changed["model"] = model
    return json_bytes(changed)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None
