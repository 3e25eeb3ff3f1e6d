"""Nothing shared across callers (issue 25.3): two callers sending the same session id (the header, `user`,
`metadata.user_id`, `prompt_cache_key`, `previous_response_id`) never share a session, with and without keys; the
decision log names the caller; the middleware takes its caller from the app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope

from d3backend import FakeEngine
from policies import parse_config
from router import D3RouterMiddleware
from tests.router._callers import ROUTES, A, B, config_text, serving

pytestmark = pytest.mark.anyio


def answers(state: Any, questions: Any) -> dict[str, Any]:
    return {"hard": 0.9 if "HARD" in json.dumps(state) else 0.1}


@pytest.fixture(params=["keys", "no-keys"])
async def http(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    server = f'\nserver:\n  decision_log: {{path: "{tmp_path / "decisions.jsonl"}"}}\n'
    text = config_text(server, request.param == "keys")
    async with serving(text, answers, {"KEY_A": A, "KEY_B": B}, path=str(tmp_path / "c.yaml")) as client:
        yield client


def chat(*texts: str, **extra: Any) -> dict[str, Any]:
    """A conversation of user turns with answers between them (so a later turn is no opening)."""
    messages: list[dict[str, Any]] = []
    for text in texts:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    return {"model": "auto", "messages": messages[:-1], **extra}


CASES: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("header", "/v1/chat/completions", {}, {"x-session-id": "s-1"}),
    ("user", "/v1/chat/completions", {"user": "user-42"}, {}),
    ("safety_identifier", "/v1/chat/completions", {"safety_identifier": "u-7"}, {}),
    ("prompt_cache_key", "/v1/chat/completions", {"prompt_cache_key": "pck-1"}, {}),
    ("metadata.user_id", "/v1/messages", {"metadata": {"user_id": "user-42"}, "max_tokens": 10}, {}),
]


@pytest.mark.parametrize(("source", "path", "extra", "headers"), CASES, ids=[case[0] for case in CASES])
async def test_two_callers_with_the_same_id_never_share_a_session(
    http: httpx.AsyncClient, source: str, path: str, extra: dict[str, Any], headers: dict[str, str]
) -> None:
    first = await http.post(
        path, json=chat("HARD question", **extra), headers={**headers, "authorization": f"Bearer {A}"}
    )
    assert first.json()["up"] == "large"
    same = await http.post(path, json=chat("HARD question", "thanks", **extra),
                           headers={**headers, "authorization": f"Bearer {A}"})  # fmt: skip
    assert same.json()["up"] == "large"  # the caller's own session holds
    other = await http.post(path, json=chat("HARD question", "thanks", **extra), headers={**headers, "x-api-key": B})
    assert other.json()["up"] == "small"  # B's own, new session: decided alone
    assert other.headers["x-d3-session"] == "new"


async def test_a_response_id_continues_only_its_own_callers_session(http: httpx.AsyncClient) -> None:
    first = await http.post("/v1/responses", json={"model": "auto", "input": "HARD question"},
                            headers={"authorization": f"Bearer {A}"})  # fmt: skip
    response_id = first.json()["id"]
    assert first.json()["up"] == "large"
    body = {"model": "auto", "input": "thanks", "previous_response_id": response_id}
    own = await http.post("/v1/responses", json=body, headers={"authorization": f"Bearer {A}"})
    assert own.json()["up"] == "large" and own.headers["x-d3-session"] == "sticky"
    stranger = await http.post("/v1/responses", json=body, headers={"authorization": f"Bearer {B}"})
    assert stranger.status_code == 400  # refused, not only kept out: the upstream would continue A's conversation
    assert stranger.json()["error"]["code"] == "previous_response_not_found"


async def test_the_decision_log_names_the_caller(http: httpx.AsyncClient, tmp_path: Path) -> None:
    await http.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": f"Bearer {A}"})
    await http.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": f"Bearer {B}"})
    path = tmp_path / "decisions.jsonl"
    for _ in range(1000):  # bounded: the log is written off the request path, by its own thread
        if len(path.read_text().splitlines()) >= 2:
            break
        await asyncio.sleep(0.01)
    callers = [json.loads(line)["caller"] for line in path.read_text().splitlines()]
    assert len(set(callers)) == 2
    assert all(caller in ("key:a", "key:b") or caller.startswith("anon:") for caller in callers)
    assert not any(A in caller or B in caller for caller in callers)


# --- the middleware takes its caller from the app -----------------------------------------------------------------
async def routed(request: Request) -> JSONResponse:
    d3 = request.state.d3
    return JSONResponse({"upstreams": list(d3.decision.action.upstreams), "session": d3.session})


class User:
    is_authenticated = True

    def __init__(self, identity: str) -> None:
        self.identity = identity


def app_with(caller: Any = None) -> Any:
    config = parse_config(ROUTES)
    inner = Starlette(routes=[Route("/v1/chat/completions", routed, methods=["POST"])])
    app = D3RouterMiddleware(inner, config=config, engine=FakeEngine(answers), caller=caller)

    async def with_user(scope: Scope, receive: Any, send: Any) -> None:  # as AuthenticationMiddleware would
        headers = dict(scope.get("headers", []))
        if b"x-user" in headers:
            scope = {**scope, "user": User(headers[b"x-user"].decode())}
        await app(scope, receive, send)

    return with_user


async def test_the_middleware_scopes_sessions_by_the_apps_user() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_with()), base_url="http://app") as http:
        ids = {"x-session-id": "s-1"}
        first = await http.post("/v1/chat/completions", json=chat("HARD"), headers={**ids, "x-user": "ann"})
        assert first.json()["upstreams"] == ["large"]
        again = await http.post("/v1/chat/completions", json=chat("HARD", "ok"), headers={**ids, "x-user": "ann"})
        assert again.json() == {"upstreams": ["large"], "session": "sticky"}
        other = await http.post("/v1/chat/completions", json=chat("HARD", "ok"), headers={**ids, "x-user": "ben"})
        assert other.json() == {"upstreams": ["small"], "session": "new"}


async def test_the_middleware_takes_a_caller_function_and_refuses_nobody() -> None:
    def caller(scope: Scope) -> str | None:
        return dict(scope["headers"]).get(b"x-tenant", b"").decode() or None

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_with(caller)), base_url="http://app") as http:
        refused = await http.post("/v1/chat/completions", json=chat("hi"))
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        ids = {"x-session-id": "s-1"}
        await http.post("/v1/chat/completions", json=chat("HARD"), headers={**ids, "x-tenant": "t1"})
        other = await http.post("/v1/chat/completions", json=chat("HARD", "ok"), headers={**ids, "x-tenant": "t2"})
        assert other.json() == {"upstreams": ["small"], "session": "new"}
