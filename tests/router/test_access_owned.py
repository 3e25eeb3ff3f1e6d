"""Stored responses and conversations are their caller's (issue 25.3, router/_sessions/owners.py), beyond the matrix
(tests/router/test_isolation_matrix.py): an upstream sent the caller's own credential is asked about ids the router
never relayed; a streamed answer's id is noted; a policy without sessions still refuses another's conversation; a
conversation's path spelled otherwise is never passed through."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import create_app
from router._translate.base import sse

pytestmark = pytest.mark.anyio

A, B = {"authorization": "Bearer sk-caller-a-0123"}, {"authorization": "Bearer sk-caller-b-0123"}
CONFIG = """
server:
  auth: {{keys: [{{name: a, key_env: KEY_A}}, {{name: b, key_env: KEY_B}}]}}
  passthrough: ['/v1/*']
upstreams:
  first: {{url: http://first.test/v1, {first}}}
policies:
  auto:
    rules: [{{name: default, route: first}}]
    session: {{mode: {mode}}}
"""
ROUTER_KEY, OWN_KEY = "api_key_env: UP_KEY", "forward_client_key: true"
seen: list[httpx.Request] = []


def upstream(request: httpx.Request) -> httpx.Response:
    seen.append(request)
    if request.url.path == "/v1/conversations":
        return httpx.Response(200, json={"id": "conv_1", "object": "conversation"})
    body = json.loads(request.content or b"{}")
    answer = {"id": f"resp_{len(seen)}", "object": "response", "status": "completed", "output": []}
    if body.get("stream"):
        data = sse({"type": "response.created", "response": answer}, "response.created")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)
    return httpx.Response(200, json=answer)


async def serving(first: str, mode: str = "sticky") -> AsyncIterator[httpx.AsyncClient]:
    seen.clear()
    environ = {"KEY_A": A["authorization"][7:], "KEY_B": B["authorization"][7:], "UP_KEY": "sk-router"}
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="first.test").mock(side_effect=upstream)
        app = create_app(parse_config(CONFIG.format(first=first, mode=mode), "c.yaml"), engine=FakeEngine({}),
                         transport=httpx.AsyncHTTPTransport(), environ=environ)  # fmt: skip
        await app.startup()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            yield client
        await app.aclose()


@pytest.fixture
async def keyed() -> AsyncIterator[httpx.AsyncClient]:
    async for client in serving(ROUTER_KEY):
        yield client


@pytest.fixture
async def own_key() -> AsyncIterator[httpx.AsyncClient]:
    async for client in serving(OWN_KEY):
        yield client


async def test_an_upstream_sent_the_callers_own_key_is_asked_about_an_unknown_id(own_key: httpx.AsyncClient) -> None:
    http = own_key
    for method, url in [("GET", "/v1/responses/resp_made_elsewhere"), ("GET", "/v1/conversations/conv_elsewhere")]:
        assert (await http.request(method, url, headers=B)).status_code == 200
        assert seen[-1].headers["authorization"] == B["authorization"]  # the upstream authenticates B itself
    body = {"model": "auto", "input": "hi", "conversation": "conv_x"}
    for caller, outcome in ((B, "new"), (B, "sticky"), (A, "new")):  # one id, two callers: two sessions
        continued = await http.post("/v1/responses", json=body, headers=caller)
        assert (continued.status_code, continued.headers["x-d3-session"]) == (200, outcome), continued.text
    mine = (await http.post("/v1/responses", json={"model": "auto", "input": "hi"}, headers=A)).json()["id"]
    count = len(seen)
    stranger = await http.get(f"/v1/responses/{mine}", headers=B)  # the router knows it is A's: refused still
    assert stranger.status_code == 404 and len(seen) == count


async def test_a_streamed_answers_id_is_noted_for_its_caller(keyed: httpx.AsyncClient) -> None:
    http = keyed
    streamed = await http.post("/v1/responses", json={"model": "auto", "input": "hi", "stream": True}, headers=A)
    assert streamed.status_code == 200 and b"response.created" in streamed.content
    url = f"/v1/responses/resp_{len(seen)}"
    assert (await http.get(url, headers=B)).status_code == 404
    own = await http.get(url, headers=A)
    assert own.status_code == 200 and seen[-1].headers["authorization"] == "Bearer sk-router"


async def test_a_policy_without_sessions_refuses_another_callers_conversation() -> None:
    async for http in serving(ROUTER_KEY, mode="off"):
        made = (await http.post("/v1/conversations", json={}, headers=A)).json()["id"]
        body: dict[str, Any] = {"model": "auto", "input": "hi", "conversation": made}
        assert (await http.post("/v1/responses", json=body, headers=A)).headers["x-d3-session"] == "off"
        count = len(seen)
        stranger = await http.post("/v1/responses", json=body, headers=B)
        assert stranger.status_code == 404 and stranger.json()["error"]["param"] == "conversation"
        assert len(seen) == count


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/conversations"), ("GET", "/v1/conversations/"), ("GET", "/v1//conversations/conv_1"),
     ("GET", "/v1/Conversations/conv_1"), ("GET", "/v1/conversations/conv%5F1"), ("GET", "/v1/conversations/conv_1/"),
     ("DELETE", "/v1/conversations/conv_1;x"), ("POST", "/v1/conversations/"), ("GET", "/v1/responses/resp_2/"),
     ("GET", "/v1/responses/resp%5F2"), ("GET", "/v1/responses/resp_2/input_items/x")],
)  # fmt: skip
async def test_a_stored_objects_path_spelled_otherwise_is_never_passed_through(
    keyed: httpx.AsyncClient, method: str, path: str
) -> None:
    http = keyed
    assert (await http.post("/v1/conversations", json={}, headers=A)).status_code == 200  # conv_1, A's
    assert (await http.post("/v1/responses", json={"model": "auto", "input": "hi"}, headers=A)).status_code == 200
    count = len(seen)
    response = await http.request(method, path, headers=A)
    assert response.status_code in (400, 404), response.text
    assert len(seen) == count


@pytest.mark.parametrize("mode", ["sticky", "off"])
async def test_another_callers_previous_response_id_is_refused_whatever_found_the_session(mode: str) -> None:
    async for http in serving(ROUTER_KEY, mode=mode):
        mine = (await http.post("/v1/responses", json={"model": "auto", "input": "hi"}, headers=A)).json()["id"]
        body = {"model": "auto", "input": "thanks", "previous_response_id": mine, "user": "u-1"}  # `user` comes first
        assert (await http.post("/v1/responses", json=body, headers=A)).status_code == 200
        count = len(seen)
        stranger = await http.post("/v1/responses", json=body, headers=B)
        assert stranger.status_code == 400 and stranger.json()["error"]["code"] == "previous_response_not_found"
        assert len(seen) == count
