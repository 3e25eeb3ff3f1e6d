"""The proxy and the middleware are one guard with two faces: the bad-input corpus sent to both gets the same
status and the same error body, and a refused request never reaches the app behind the middleware (issue 16)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from fastapi import Body, FastAPI, Request

from d3backend import FakeEngine
from policies import parse_config
from router import D3RouterMiddleware, create_app
from tests.router.test_bad_input import CASES, CONFIG

pytestmark = pytest.mark.anyio

Faces = tuple[httpx.AsyncClient, httpx.AsyncClient, list[str]]


def app_behind(config: Any, calls: list[str]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(D3RouterMiddleware, config=config, engine=FakeEngine({"jailbreak": 0.1}))

    @app.post("/v1/chat/completions")
    @app.post("/v1/messages")
    async def handler(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        calls.append(request.url.path)
        return {"decided": getattr(request.state, "d3", None) is not None}

    return app


async def faces(text: str) -> AsyncIterator[Faces]:
    config = parse_config(text, "c.yaml")
    calls: list[str] = []
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="small.test").mock(return_value=httpx.Response(200, json={"upstream": True}))
        proxy = create_app(config, engine=FakeEngine({"jailbreak": 0.1}), transport=httpx.AsyncHTTPTransport())
        async with (
            proxy,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://proxy") as to_proxy,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app_behind(config, calls)), base_url="http://app")
            as to_app,
        ):  # fmt: skip
            yield to_proxy, to_app, calls


@pytest.fixture
async def both() -> AsyncIterator[Faces]:
    async for pair in faces(CONFIG):
        yield pair


@pytest.mark.parametrize(("body", "content_type", "status", "message"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])  # fmt: skip
async def test_both_faces_refuse_the_corpus_alike(
    both: Faces, body: Any, content_type: str, status: int, message: str | None, request: pytest.FixtureRequest
) -> None:
    to_proxy, to_app, calls = both
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": content_type}
    proxied = await to_proxy.post("/v1/chat/completions", content=raw, headers=headers)
    behind = await to_app.post("/v1/chat/completions", content=raw, headers=headers)
    assert proxied.status_code == status
    if request.node.callspec.id.startswith("model-"):
        # No policy named and no server.default_policy: closed by default (issue 25.2), both faces answer 404 alike
        # and the app never sees the request (it used to reach the app undecided).
        assert behind.status_code == 404 and behind.json() == proxied.json() and calls == []
        return
    assert behind.status_code == proxied.status_code
    if status >= 400:
        assert behind.json() == proxied.json()  # the same error, word for word, in the same shape
        assert calls == []  # and the app never saw the request
    else:
        assert calls == ["/v1/chat/completions"] and behind.json() == {"decided": True}
        assert behind.headers["x-d3-action"] == proxied.headers["x-d3-action"] == "route"
        assert "x-d3-rule" not in behind.headers and "x-d3-rule" not in proxied.headers  # no debug view by default


async def test_with_a_default_policy_no_model_reaches_the_app_undecided() -> None:
    async for _, app_client, app_calls in faces(CONFIG.replace("server: {", "server: {default_policy: auto, ", 1)):
        for model in ("auto", "gpt-9", 7, None):
            response = await app_client.post("/v1/chat/completions",
                                              json={"model": model, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
            assert response.json() == {"decided": True}
        assert len(app_calls) == 4


@pytest.mark.parametrize("raw", [b"", b'{"model": "auto", "messages":', b'{"model":"auto","model":"x","messages":[]}'])
async def test_the_messages_path_is_guarded_in_the_apis_own_shape(both: Faces, raw: bytes) -> None:
    to_proxy, to_app, calls = both
    headers = {"content-type": "application/json"}
    proxied = await to_proxy.post("/v1/messages", content=raw, headers=headers)
    behind = await to_app.post("/v1/messages", content=raw, headers=headers)
    assert proxied.status_code == behind.status_code == 400
    assert behind.json() == proxied.json()
    assert behind.json()["type"] == "error" and behind.json()["error"]["type"] == "invalid_request_error"
    assert calls == []
