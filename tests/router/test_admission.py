"""Bounded memory: past `server.max_concurrent_requests` or `server.max_buffered_bytes` a request gets 503 with
Retry-After in its API's own shape, before the process runs out; probes are answered under any load; every
reservation is given back, whatever the request ended in."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import respx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from d3backend import FakeEngine
from policies import parse_config
from router import D3RouterMiddleware, create_app

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{admin_token_env: D3_ADMIN, max_concurrent_requests: {requests}, max_buffered_bytes: {bytes}}}
upstreams: {{up: {{url: http://up.test/v1}}}}
policies:
  auto:
    apis: [chat, messages]
    questions: {{jailbreak: {{type: noul}}}}
    rules:
      - {{name: guard, when: jailbreak > 0.9, block: {{status: 403, message: Refused.}}}}
      - {{name: default, route: up}}
"""


def chat(text: str = "hello") -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}]}


class Gate:
    """An engine that holds each request it answers until released."""

    def __init__(self) -> None:
        self.inner = FakeEngine(lambda state, questions: {"jailbreak": 0.1})
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def decide(self, *args: Any, **kwargs: Any) -> Any:
        self.held.set()
        await self.release.wait()
        return await self.inner.decide(*args, **kwargs)

    async def aclose(self) -> None:
        pass


def app_with(requests: int = 512, size: int = 1 << 28, engine: Any = None) -> Any:
    engine = engine or FakeEngine(lambda state, questions: {"jailbreak": 0.1})
    config = parse_config(CONFIG.format(requests=requests, bytes=size), "c.yaml")
    return create_app(config, engine=engine, transport=httpx.AsyncHTTPTransport(), environ={"D3_ADMIN": "admin"})


@pytest.fixture
def upstream() -> Any:
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://up.test/v1/chat/completions").respond(200, json={"ok": True})
        mock.post("http://up.test/v1/messages").respond(200, json={"ok": True})
        yield mock


async def test_past_the_request_limit_a_request_gets_503_in_its_apis_shape(upstream: Any) -> None:
    """Before: no limit at all; uvicorn ran without one, and each request could hold a 4 MiB body."""
    gate = Gate()
    app = app_with(requests=1, engine=gate)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=chat()))
        await asyncio.wait_for(gate.held.wait(), 10)
        refused = await client.post("/v1/chat/completions", json=chat("another"))
        anthropic = await client.post("/v1/messages", json={"model": "auto", "max_tokens": 8,
                                                            "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        health = await client.get("/healthz")
        gate.release.set()
        assert (await asyncio.wait_for(first, 10)).status_code == 200
        after = await client.post("/v1/chat/completions", json=chat("and now"))
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert refused.json()["error"]["type"] == "overloaded_error"
    assert "server.max_concurrent_requests" in refused.json()["error"]["message"]
    assert anthropic.status_code == 503
    assert anthropic.json() == {"type": "error", "error": {"type": "overloaded_error",
                                                          "message": anthropic.json()["error"]["message"]}}  # fmt: skip
    assert health.status_code == 200  # probes are answered under any load
    assert after.status_code == 200
    assert (app.admission.requests, app.admission.bytes) == (0, 0)
    await app.aclose()


async def test_past_the_byte_bound_a_body_gets_503(upstream: Any) -> None:
    gate = Gate()
    body = json.dumps(chat("x" * 300)).encode()
    app = app_with(size=len(body) + 100, engine=gate)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        headers = {"content-type": "application/json"}
        first = asyncio.create_task(client.post("/v1/chat/completions", content=body, headers=headers))
        await asyncio.wait_for(gate.held.wait(), 10)  # its body is held
        assert app.admission.bytes == len(body)
        refused = await client.post("/v1/chat/completions", content=body, headers=headers)
        admin = {**headers, "authorization": "Bearer admin"}  # explain needs the admin token (closed by default)
        small = await client.post("/v1/d3/explain", content=body, headers=admin)  # explain counts too
        gate.release.set()
        assert (await asyncio.wait_for(first, 10)).status_code == 200
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert "server.max_buffered_bytes" in refused.json()["error"]["message"]
    assert small.status_code == 503
    assert (app.admission.requests, app.admission.bytes) == (0, 0)
    await app.aclose()


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"model": "auto", "messages": "x"}', b'{"model": "auto", "messages": [{"role": "user"'],
)
async def test_every_reservation_is_given_back(upstream: Any, content: bytes) -> None:
    app = app_with()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        response = await client.post("/v1/chat/completions", content=content,
                                     headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 400
    assert (app.admission.requests, app.admission.bytes) == (0, 0)
    await app.aclose()


async def test_the_middleware_has_the_same_bound() -> None:
    gate = Gate()

    async def chat_handler(request: Request) -> JSONResponse:
        return JSONResponse({"rule": request.state.d3.decision.rule})

    inner = Starlette(routes=[Route("/v1/chat/completions", chat_handler, methods=["POST"])])
    config = parse_config(CONFIG.format(requests=1, bytes=1 << 20), "c.yaml")
    app: Any = D3RouterMiddleware(inner, config=config, engine=gate)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=chat()))
        await asyncio.wait_for(gate.held.wait(), 10)
        refused = await client.post("/v1/chat/completions", json=chat("another"))
        gate.release.set()
        assert (await asyncio.wait_for(first, 10)).json() == {"rule": "default"}
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert (app.admission.requests, app.admission.bytes) == (0, 0)
