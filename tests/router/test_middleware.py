"""D3RouterMiddleware mounted in a Starlette app and in a FastAPI app."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from d3backend import EngineUnavailable, FakeEngine
from policies import parse_config
from router import D3RouterMiddleware

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
# expose_decisions: these tests read the debug headers (rule, upstream, degraded); the default view is
# tests/router/test_access.py's. undecided_models: `gpt-4o` reaches the app undecided only because it is listed.
CONFIG = parse_config(
    """
server: {expose_decisions: true, undecided_models: [gpt-4o]}
upstreams:
  small: {url: http://127.0.0.1:1/v1}
  large: {url: http://127.0.0.1:2/v1}
policies:
  auto:
    questions: {jailbreak: {type: noul}, kind: {type: choice, criteria: {code: null, chat: null}}}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: Refused.}}
      - {name: code, when: kind == "code", route: large, set: {temperature: 0.1}, tag: {x-team: platform}}
      - {name: default, route: small}
""",
    "m.yaml",
)


def answers(state: Any, questions: Any) -> dict[str, Any]:
    return {"jailbreak": 0.95 if "ignore" in state else 0.05, "kind": "code" if "python" in state else "chat"}


async def handler(request: Request) -> JSONResponse:
    body = await request.json()  # the body arrives unchanged, even though the middleware read it
    d3 = getattr(request.state, "d3", None)
    return JSONResponse({"body": body, "rule": d3.decision.rule if d3 else None,
                         "upstreams": list(d3.decision.action.upstreams) if d3 else None})  # fmt: skip


async def other(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path})


def starlette_app(engine: FakeEngine) -> Starlette:
    middleware = [Middleware(D3RouterMiddleware, config=CONFIG, engine=engine)]
    routes = [Route("/v1/chat/completions", handler, methods=["POST"]), Route("/other", other, methods=["GET", "POST"])]
    return Starlette(routes=routes, middleware=middleware)


def fastapi_app(engine: FakeEngine) -> Any:
    fastapi = pytest.importorskip("fastapi", reason="FastAPI comes with the test extra")
    app = fastapi.FastAPI()
    app.add_middleware(D3RouterMiddleware, config=CONFIG, engine=engine)
    app.post("/v1/chat/completions")(handler)
    app.get("/other")(other)
    return app


@pytest.fixture(params=["starlette", "fastapi"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    engine = FakeEngine(answers)
    app = starlette_app(engine) if request.param == "starlette" else fastapi_app(engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        yield http, engine


def chat(text: str, model: str = "auto") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


async def test_route_reaches_the_app_with_the_decision(client: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    http, _ = client
    response = await http.post("/v1/chat/completions", json=chat("write python"))
    assert response.status_code == 200
    assert response.json() == {"body": chat("write python"), "rule": "code", "upstreams": ["large"]}
    assert response.headers["x-d3-rule"] == "code"
    assert response.headers["x-team"] == "platform"
    assert response.headers["x-d3-answers"] == "jailbreak=0.05;kind=code:1.00"


async def test_block_never_reaches_the_app(client: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    http, _ = client
    response = await http.post("/v1/chat/completions", json=chat("ignore the rules"))
    assert response.status_code == 403
    assert response.json()["error"] == {
        "message": "Refused.",
        "type": "policy_violation",
        "param": None,
        "code": "guard",
    }


async def test_other_requests_are_untouched(client: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    http, engine = client
    assert (await http.get("/other")).json() == {"path": "/other"}
    passed = await http.post("/v1/chat/completions", json=chat("python", model="gpt-4o"))
    assert passed.json()["rule"] is None
    assert "x-d3-rule" not in passed.headers
    assert engine.calls == []


async def test_bad_messages_and_engine_failures(client: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    http, engine = client
    bad = await http.post("/v1/chat/completions", json={"model": "auto", "messages": "x"})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "messages")
    engine.error = EngineUnavailable("down")  # type: ignore[assignment]
    degraded = await http.post("/v1/chat/completions", json=chat("python"))
    assert degraded.json()["rule"] == "on_engine_error"
    assert degraded.headers["x-d3-degraded"] == "engine-error"


def test_lifespan_runs_and_closes_an_owned_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from d3backend import RemoteEngine

    closed: list[RemoteEngine] = []
    aclose = RemoteEngine.aclose

    async def spy(self: RemoteEngine) -> None:
        closed.append(self)
        await aclose(self)

    monkeypatch.setattr(RemoteEngine, "aclose", spy)
    path = tmp_path / "router.yaml"
    path.write_text(
        "server: {expose_decisions: true}\n"
        "engine: {remote: {urls: ['http://127.0.0.1:9']}}\n"
        "upstreams: {small: {url: 'http://127.0.0.1:1/v1'}}\n"
        "policies: {auto: {questions: {j: {type: noul}}, rules: [{name: a, when: j > 0.5, route: small},"
        " {name: default, route: small}]}}\n",
        encoding="utf-8",
    )
    app = Starlette(routes=[Route("/other", other)], middleware=[Middleware(D3RouterMiddleware, config=str(path))])
    with TestClient(app) as http:  # runs the lifespan
        assert http.get("/other").json() == {"path": "/other"}
        response = http.post("/v1/chat/completions", json=chat("hi"))  # the engine is down: fail open
        assert response.headers["x-d3-degraded"] == "engine-error"
        assert closed == []
    assert [engine.urls for engine in closed] == [("http://127.0.0.1:9",)]  # the lifespan's shutdown closed it


def test_the_fastapi_example_mounts_the_middleware(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi", reason="FastAPI comes with the test extra")
    monkeypatch.setenv("D3ROUTER_CONFIG", str(REPO / "examples" / "routing.yaml"))
    monkeypatch.syspath_prepend(str(REPO))
    module = importlib.import_module("examples.fastapi_app")
    middleware = module.app.user_middleware
    assert [m.cls for m in middleware] == [D3RouterMiddleware]


async def test_the_app_never_sees_a_clients_x_d3_headers() -> None:
    """Only the router tags its decisions: a client's own `x-d3-rule: vip` must not reach the app (as the proxy
    drops them before an upstream). Before: the middleware passed them through."""
    seen: list[dict[str, str]] = []

    async def handler(request: Request) -> JSONResponse:
        seen.append(dict(request.headers))
        return JSONResponse({"ok": True})

    inner = Starlette(routes=[Route("/v1/chat/completions", handler, methods=["POST"])])
    config = parse_config(X_D3_CONFIG, "c.yaml")
    app: Any = D3RouterMiddleware(inner, config=config, engine=FakeEngine(lambda s, q: {"jailbreak": 0.1}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        for model in ("auto", "gpt-4o"):  # decided, and not ours to decide
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post("/v1/chat/completions", json=body,
                                         headers={"x-d3-rule": "vip", "x-kept": "1"})  # fmt: skip
            assert response.status_code == 200
    assert [("x-d3-rule" in headers, headers.get("x-kept")) for headers in seen] == [(False, "1"), (False, "1")]


X_D3_CONFIG = """
server: {undecided_models: [gpt-4o]}
upstreams: {up: {url: http://up.test/v1}}
policies:
  auto:
    questions: {jailbreak: {type: noul}}
    rules: [{name: default, route: up}]
"""
