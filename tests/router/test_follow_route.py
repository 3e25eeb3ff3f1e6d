"""Tags follow the route taken (issue 26.5): a sticky turn's upstream request carries the tags and `set` of the route
it is sent on (the rule routing there), not of the rule that decided the turn; tag-only rules keep theirs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route as Path

from d3backend import FakeEngine, NoulAnswer
from policies import parse_config
from router import D3RouterMiddleware, create_app

pytestmark = pytest.mark.anyio

CONFIG = """
server: {expose_decisions: true}
upstreams:
  small: {url: http://small.test/v1, model: small-model}
  large: {url: http://large.test/v1, model: big-model}
policies:
  auto:
    questions: {hard: {type: noul}, code: {type: noul}}
    rules:
      - {name: coding, when: code > 0.5, tag: {x-kind: code}}
      - {name: hard, when: hard > 0.5, route: large, tag: {x-tier: large}, set: {temperature: 0.1}}
      - {name: default, route: small, tag: {x-tier: small}, set: {max_tokens: 7}}
"""


def answers(state: Any, questions: Any) -> dict[str, Any]:
    text = json.dumps(state)
    return {"hard": 0.9 if "HARD" in text else 0.1, "code": 0.9 if "CODE" in text else 0.1}


def turns(*texts: str) -> list[dict[str, str]]:
    """A conversation: user turns with an assistant answer between them."""
    messages: list[dict[str, str]] = []
    for text in texts:
        if messages:
            messages.append({"role": "assistant", "content": "ok"})
        messages.append({"role": "user", "content": text})
    return messages


@pytest.fixture
def seen() -> AsyncIterator[list[httpx.Request]]:
    requests: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"ok": True})

    with respx.mock:
        respx.route(host__in=["small.test", "large.test"]).mock(side_effect=record)
        yield requests  # type: ignore[misc]


async def test_a_sticky_turn_carries_the_tags_and_set_of_the_route_it_is_sent_on(seen: list[httpx.Request]) -> None:
    app = create_app(parse_config(CONFIG, "c.yaml"), engine=FakeEngine(answers), transport=httpx.AsyncHTTPTransport())
    headers = {"x-session-id": "s1"}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
            first = await client.post("/v1/chat/completions", headers=headers,
                                      json={"model": "auto", "messages": turns("HARD problem")})  # fmt: skip
            second = await client.post("/v1/chat/completions", headers=headers,
                                       json={"model": "auto", "messages": turns("HARD problem", "CODE it")})  # fmt: skip
        assert first.headers["x-d3-upstream"] == "large"
        assert (second.headers["x-d3-rule"], second.headers["x-d3-session"]) == ("default", "sticky")
        sent = seen[-1]
        assert sent.url.host == "large.test"
        assert (sent.headers["x-tier"], sent.headers["x-kind"]) == ("large", "code")
        body = json.loads(sent.content)
        assert (body["model"], body["temperature"]) == ("big-model", 0.1)
        assert "max_tokens" not in body  # the deciding rule's `set` went with its route
        assert second.headers["x-tier"] == "large"  # what the response says is what was sent
    finally:
        await app.aclose()


async def test_the_middleware_tags_the_route_taken() -> None:
    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"route": list(request.state.d3.decision.action.upstreams)})

    inner = Starlette(routes=[Path("/v1/chat/completions", chat, methods=["POST"])])
    app = D3RouterMiddleware(inner, config=parse_config(CONFIG, "c.yaml"), engine=FakeEngine(answers))
    headers = {"x-session-id": "s2"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        await client.post("/v1/chat/completions", headers=headers, json={"model": "auto", "messages": turns("HARD")})
        second = await client.post("/v1/chat/completions", headers=headers,
                                   json={"model": "auto", "messages": turns("HARD", "easy")})  # fmt: skip
    assert second.json() == {"route": ["large"]}
    assert second.headers["x-tier"] == "large"


def test_sent_on_keeps_the_request_tags_and_takes_the_routes() -> None:
    policy = parse_config(CONFIG, "c.yaml").policies["auto"]
    decided = policy.evaluate({"hard": NoulAnswer(0.1, 1.0), "code": NoulAnswer(0.9, 1.0)})
    moved = policy.sent_on(decided, ("large",))
    assert (decided.tags, decided.params) == ({"x-kind": "code", "x-tier": "small"}, {"max_tokens": 7})
    assert (moved.rule, moved.tags, moved.params) == ("default", {"x-kind": "code", "x-tier": "large"},
                                                      {"temperature": 0.1})  # fmt: skip
    assert policy.sent_on(decided, ("small",)) is decided
    unknown = policy.sent_on(decided, ("elsewhere",))  # no rule routes there (a reload): no route's tags
    assert (unknown.tags, unknown.params) == ({"x-kind": "code"}, {})
