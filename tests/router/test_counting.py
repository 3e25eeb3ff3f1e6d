"""Token counting routed (issue 26.3): `/v1/messages/count_tokens` and `/v1/responses/input_tokens` go to the upstream
the request would be routed to (the session's route, else the default route) with no engine call, the model
rewritten and the key in the API's own header; an upstream that cannot count gets the router's estimate, marked.
Errors on `/v1/messages*` are Anthropic's; `/v1/models` answers Anthropic clients in Anthropic's list shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import ProxyApp, create_app
from tests.router._peers import proxy_clients

pytestmark = pytest.mark.anyio

CONFIG = """
server: {auth: {keys: [{name: agent, key_env: AGENT_KEY}]}}
upstreams:
  small: {url: http://small.test/v1, model: small-model, api_key_env: SMALL_KEY}
  large: {url: http://large.test/v1, model: big-model, api_key_env: LARGE_KEY}
policies:
  auto:
    questions: {hard: {type: noul}}
    rules:
      - {name: hard, when: hard > 0.5, route: large, set: {max_tokens: 99}}
      - {name: default, route: [small, large]}
"""
ENVIRON = {"AGENT_KEY": "sk-agent", "SMALL_KEY": "sk-small", "LARGE_KEY": "sk-large"}
ASKED: list[str] = []  # what reached the engine


def answers(state: Any, questions: Any) -> dict[str, Any]:
    ASKED.append(json.dumps(state))
    return {"hard": 0.9 if "HARD" in json.dumps(state) else 0.1}


@pytest.fixture
async def app() -> AsyncIterator[ProxyApp]:
    ASKED.clear()
    proxy = create_app(parse_config(CONFIG, "c.yaml"), engine=FakeEngine(answers),
                       transport=httpx.AsyncHTTPTransport(), environ=ENVIRON)  # fmt: skip
    yield proxy
    await proxy.aclose()


http, claude, gpt = proxy_clients()  # of `app`, in process


def counter(tokens: int, seen: list[httpx.Request]) -> Any:
    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"input_tokens": tokens})

    return respond


async def test_the_anthropic_sdks_count_goes_to_the_default_route_with_its_key(
    claude: anthropic.AsyncAnthropic,
) -> None:
    seen: list[httpx.Request] = []
    with respx.mock:
        respx.post("http://small.test/v1/messages/count_tokens").mock(side_effect=counter(42, seen))
        counted = await claude.messages.count_tokens(
            model="auto", messages=[{"role": "user", "content": "HARD question"}], system="Be brief."
        )
    assert counted.input_tokens == 42
    sent = seen[0]
    assert sent.headers["x-api-key"] == "sk-small"
    assert "authorization" not in sent.headers  # neither the Bearer form nor the client's key
    body = json.loads(sent.content)
    assert body["model"] == "small-model"
    assert "max_tokens" not in body  # no rule's `set`: a count takes no generation parameters
    assert ASKED == []  # no engine call: the default route, although the text would have been routed to large


async def test_a_sessions_count_goes_to_the_sessions_route(http: httpx.AsyncClient) -> None:
    seen: list[httpx.Request] = []
    headers = {"x-api-key": "sk-agent", "x-session-id": "conv-1", "anthropic-version": "2023-06-01"}
    turn = {"model": "auto", "max_tokens": 8, "messages": [{"role": "user", "content": "HARD"}]}
    with respx.mock:
        respx.post("http://large.test/v1/messages").mock(return_value=httpx.Response(200, json={"ok": True}))
        respx.post("http://large.test/v1/messages/count_tokens").mock(side_effect=counter(7, seen))
        assert (await http.post("/v1/messages", json=turn, headers=headers)).status_code == 200
        asked = len(ASKED)
        later = {"model": "auto", "messages": [*turn["messages"], {"role": "assistant", "content": "ok"},  # type: ignore[list-item]
                                                {"role": "user", "content": "easy"}]}  # fmt: skip
        response = await http.post("/v1/messages/count_tokens", json=later, headers=headers)
    assert response.json() == {"input_tokens": 7}
    assert seen[0].headers["x-api-key"] == "sk-large"
    assert json.loads(seen[0].content)["model"] == "big-model"
    assert len(ASKED) == asked


@pytest.mark.parametrize("status", [404, 405, 501])
async def test_an_upstream_that_cannot_count_gets_the_routers_estimate(http: httpx.AsyncClient, status: int) -> None:
    text = "x" * 37  # 37 characters: ceil(37 / 4) = 10 tokens
    with respx.mock:
        respx.post("http://small.test/v1/messages/count_tokens").mock(return_value=httpx.Response(status))
        response = await http.post("/v1/messages/count_tokens", headers={"x-api-key": "sk-agent"},
                                   json={"model": "auto", "messages": [{"role": "user", "content": text}]})  # fmt: skip
    assert response.status_code == 200
    assert response.headers["x-d3-estimate"] == "true"
    assert response.json() == {"input_tokens": 10}


async def test_a_count_falls_back_to_the_routes_next_upstream_on_a_5xx(http: httpx.AsyncClient) -> None:
    seen: list[httpx.Request] = []
    with respx.mock:
        respx.post("http://small.test/v1/messages/count_tokens").mock(return_value=httpx.Response(503))
        respx.post("http://large.test/v1/messages/count_tokens").mock(side_effect=counter(5, seen))
        response = await http.post("/v1/messages/count_tokens", headers={"x-api-key": "sk-agent"},
                                   json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert response.json() == {"input_tokens": 5}
    assert "x-d3-estimate" not in response.headers


async def test_the_openai_sdks_input_tokens_go_routed_with_a_bearer_key(http: httpx.AsyncClient) -> None:
    seen: list[httpx.Request] = []
    client = openai.AsyncOpenAI(base_url="http://router/v1", api_key="sk-agent", http_client=http, max_retries=0)

    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"object": "response.input_tokens", "input_tokens": 11})

    with respx.mock:
        respx.post("http://small.test/v1/responses/input_tokens").mock(side_effect=respond)
        counted = await client.responses.input_tokens.count(model="auto", input="hello there")
    assert counted.input_tokens == 11
    assert seen[0].headers["authorization"] == "Bearer sk-small"
    assert json.loads(seen[0].content)["model"] == "small-model"


async def test_the_responses_estimate_is_in_its_own_shape(http: httpx.AsyncClient) -> None:
    with respx.mock:
        respx.post("http://small.test/v1/responses/input_tokens").mock(return_value=httpx.Response(404))
        response = await http.post("/v1/responses/input_tokens", headers={"authorization": "Bearer sk-agent"},
                                   json={"model": "auto", "input": "12345678"})  # fmt: skip
    assert response.json() == {"object": "response.input_tokens", "input_tokens": 2}
    assert response.headers["x-d3-estimate"] == "true"


@pytest.mark.parametrize(
    ("path", "headers", "body", "status", "kind"),
    [
        ("/v1/messages/count_tokens", {}, b"{}", 401, "authentication_error"),
        ("/v1/messages/count_tokens", {"x-api-key": "sk-agent"}, b"{not json", 400, "invalid_request_error"),
        ("/v1/messages/count_tokens", {"x-api-key": "sk-agent"}, b'{"model": "nope"}', 404, "not_found_error"),
        ("/v1/messages/batches", {"x-api-key": "sk-agent"}, b"{}", 404, "not_found_error"),
        ("/v1/messages/count_tokens/", {"x-api-key": "sk-agent"}, b"{}", 404, "not_found_error"),
    ],
)
async def test_errors_under_v1_messages_are_anthropics(
    http: httpx.AsyncClient, path: str, headers: dict[str, str], body: bytes, status: int, kind: str
) -> None:
    response = await http.post(path, content=body, headers={"content-type": "application/json", **headers})
    assert response.status_code == status
    error = response.json()
    assert (error["type"], error["error"]["type"]) == ("error", kind)


async def test_models_answers_anthropic_clients_in_anthropics_shape(
    http: httpx.AsyncClient, claude: anthropic.AsyncAnthropic
) -> None:
    page = await claude.models.list()
    assert [(model.id, model.type) for model in page.data] == [("auto", "model")]
    plain = await http.get("/v1/models", headers={"authorization": "Bearer sk-agent"})
    assert plain.json()["object"] == "list" and plain.json()["data"][0]["id"] == "auto"
    refused = await http.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert (refused.status_code, refused.json()["error"]["type"]) == (401, "authentication_error")


async def test_a_count_path_spelled_otherwise_is_named_in_the_refusal(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/messages//count_tokens/", json={}, headers={"x-api-key": "sk-agent"})
    assert response.status_code == 404
    assert "/v1/messages/count_tokens is served as POST /v1/messages/count_tokens only" in response.text
