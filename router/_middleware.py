"""`D3RouterMiddleware`: d3-router's decisions inside any Starlette or FastAPI app.

    app = FastAPI()
    app.add_middleware(D3RouterMiddleware, config="router.yaml")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        d3 = request.state.d3            # a D3Decision: .decision.action, .decision.rule, .answers, ...

For `POST` to the chat path with a model a policy names, the middleware decides before the app sees the request:
a block is answered with the OpenAI-shaped error and never reaches the app; otherwise the request goes on, body
unchanged, with the decision at `request.state.d3` and the `x-d3-*` headers and tags added to the response.
Every other request passes through untouched. The engine starts with the app's lifespan (or on first use).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from d3backend import DecisionEngine, EmbeddedEngine
from policies import Block, Config, load_config
from router._engines import build_engine
from router._http import BodyTooLarge, ClientDisconnected, encode_headers, read_body, send_error
from router._service import RouterService
from router._state import BadChatRequest


class D3RouterMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        config: Config | str | os.PathLike[str],
        engine: DecisionEngine | None = None,
        path: str = "/v1/chat/completions",
    ) -> None:
        self.app = app
        loaded = config if isinstance(config, Config) else load_config(config)
        self._owns_engine = engine is None
        if engine is None and any(policy.questions for policy in loaded.policies.values()):
            engine = build_engine(loaded.engine, base_dir=Path(loaded.file).parent, environ=os.environ)
        self.service = RouterService(loaded, engine)
        self.path = path
        self._started = engine is None
        self._start_lock = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        try:
            raw = await read_body(receive, self.service.config.server.max_body_bytes)
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc), "invalid_request_error")
            return
        except ClientDisconnected:
            return  # gone while sending its body: nothing to decide, no one to answer
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        policy = None
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            policy = self.service.config.policies.get(body["model"])
        if policy is None:  # not ours to decide: the app sees the request as it came
            await self.app(scope, _replay(raw, receive), send)
            return
        await self._start()
        try:
            d3 = await self.service.decide(policy, body)
        except BadChatRequest as exc:
            await send_error(send, 400, exc.message, "invalid_request_error", param=exc.param)
            return
        headers = encode_headers(d3.headers())
        action = d3.decision.action
        if isinstance(action, Block):
            await send_error(send, action.status, action.message, "policy_violation", code=d3.decision.rule,
                             headers=headers)  # fmt: skip
            return
        scope.setdefault("state", {})["d3"] = d3

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *headers]}
            await send(message)

        await self.app(scope, _replay(raw, receive), send_with_headers)

    async def _start(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if not self._started:
                engine = self.service.engine
                inner: Any = getattr(engine, "engine", engine)
                if isinstance(inner, EmbeddedEngine):
                    await inner.start()
                self._started = True

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._start()
            elif message["type"] == "lifespan.shutdown" and self._owns_engine and self.service.engine is not None:
                await self.service.engine.aclose()
            return message

        return wrapped


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the already-read body once, then defers to the real one (for disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
