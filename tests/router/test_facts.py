"""Facts through the proxy (issue 29.1): a request the facts decide makes no engine call, on each API; the caller's
facts come from its client key; the request's facts are computed per adapter from the parsed body."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from d3backend import Noul, RemoteEngine, answer_from, answer_wire
from policies import StateSettings, parse_config
from router import API_BY_NAME, ProxyApp, create_app
from router._apis.facts import caller_facts, estimate_tokens, request_facts
from router._apis.state import DEFAULT_MEDIA

pytestmark = pytest.mark.anyio

WEB, NIGHTLY, DEBUG = "sk-web-0123456789", "sk-nightly-0123456789", "sk-debug-0123456789"
CONFIG = """
server:
  default_policy: auto
  expose_decisions: true
  auth:
    keys:
      - {name: web, key_env: K_WEB}
      - {name: nightly, key_env: K_NIGHTLY, group: batch}
      - {name: dbg, key_env: K_DEBUG, group: ops, debug: true}
upstreams:
  small: {url: http://small.test/v1, model: small-model}
  long: {url: http://long.test/v1, model: long-model}
policies:
  auto:
    state: {from: last_user, max_chars: 200}
    questions: {jailbreak: {type: noul}}
    rules:
      - {name: long-context, when: request.tokens > 1000, route: long}
      - {name: batch, when: caller.group == "batch" and caller.name == "nightly", route: small, tag: {x-batch: "1"}}
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: Refused by policy.}}
      - {name: default, route: small}
"""
PATHS = {api.name: api.path for api in API_BY_NAME.values()}
LONG = "lorem ipsum dolor sit amet " * 200  # 5,400 characters: about 1,350 tokens


def body(api: str, text: str, **extra: Any) -> dict[str, Any]:
    if api == "chat":
        return {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}
    if api == "completions":
        return {"model": "auto", "prompt": text, **extra}
    if api == "responses":
        return {"model": "auto", "input": text, **extra}
    return {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": text}], **extra}


def systemone(request: httpx.Request) -> httpx.Response:
    asked = json.loads(request.content)["questions"]
    answer = answer_wire(answer_from(Noul("?"), 0.01))
    return httpx.Response(200, json={"model": "d3", "answers": dict.fromkeys(asked, answer), "usage": {}})


def upstream(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"upstream": request.url.host.split(".")[0]})


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        router.post("http://d3.test/v1/systemone", name="engine").mock(side_effect=systemone)
        router.route(host="small.test").mock(side_effect=upstream)
        router.route(host="long.test").mock(side_effect=upstream)
        yield router


@pytest.fixture
async def client(mock: respx.MockRouter) -> AsyncIterator[httpx.AsyncClient]:
    engine = RemoteEngine(["http://d3.test"], model="d3", transport=httpx.MockTransport(mock.async_handler))
    app: ProxyApp = create_app(parse_config(CONFIG, "c.yaml"), engine=engine, transport=httpx.AsyncHTTPTransport(),
                               environ={"K_WEB": WEB, "K_NIGHTLY": NIGHTLY, "K_DEBUG": DEBUG})  # fmt: skip
    async with engine, app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as http:
        yield http


def key(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


@pytest.mark.parametrize("api", list(PATHS))
async def test_a_request_over_the_size_threshold_makes_no_engine_call(
    client: httpx.AsyncClient, mock: respx.MockRouter, api: str
) -> None:
    response = await client.post(PATHS[api], json=body(api, LONG), headers=key(WEB))
    assert response.status_code == 200, response.text
    assert response.json() == {"upstream": "long"}
    assert response.headers["x-d3-rule"] == "long-context"
    assert mock["engine"].call_count == 0
    # The same API under the threshold asks the engine once: the count above is the engine's.
    short = await client.post(PATHS[api], json=body(api, "hello there"), headers=key(WEB))
    assert short.headers["x-d3-rule"] == "default" and short.json() == {"upstream": "small"}
    assert mock["engine"].call_count == 1


async def test_the_callers_group_and_name_come_from_its_key(client: httpx.AsyncClient, mock: respx.MockRouter) -> None:
    nightly = await client.post(PATHS["chat"], json=body("chat", "hello there"), headers=key(NIGHTLY))
    assert nightly.status_code == 200
    assert nightly.headers["x-d3-rule"] == "batch" and nightly.headers["x-batch"] == "1"
    assert mock["engine"].call_count == 0
    web = await client.post(PATHS["chat"], json=body("chat", "hello there"), headers=key(WEB))
    assert web.headers["x-d3-rule"] == "default"
    assert mock["engine"].call_count == 1


async def test_explain_shows_the_facts_and_asks_nothing(client: httpx.AsyncClient, mock: respx.MockRouter) -> None:
    response = await client.post("/v1/d3/explain", json=body("responses", LONG, stream=True), headers=key(DEBUG))
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["decision"]["rule"] == "long-context" and payload["asked"] == [] and payload["engine_calls"] == 0
    assert payload["skipped"] == ["jailbreak"]
    facts = payload["facts"]
    assert facts["caller.name"] == "dbg" and facts["caller.group"] == "ops"
    assert facts["request.api"] == "responses" and facts["request.stream"] is True
    assert facts["request.chars"] == len(LONG) and facts["request.tokens"] == estimate_tokens(LONG, 1)
    assert mock["engine"].call_count == 0


# --- the facts each adapter computes ---------------------------------------------------------------------------------
IMAGE = {"type": "image_url", "image_url": {"url": "https://img.example.com/a.png"}}
CASES = {
    "chat": {
        "model": "auto",
        "stream": True,
        "tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Look"}, IMAGE, IMAGE]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and this?"},
        ],
    },
    "completions": {"model": "auto", "prompt": "Say hi", "stream": False},
    "responses": {
        "model": "auto",
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "f"}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Look"}, IMAGE]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and this?"},
        ],
    },
    "messages": {
        "model": "auto",
        "max_tokens": 8,
        "stream": True,
        "system": "Be brief.",
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Look"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and this?"},
        ],
    },
}
EXPECTED = {
    "chat": {"request.chars": 9 + 4 + 2 + 9, "request.turns": 2, "request.tools": 2, "request.images": 2,
             "request.stream": True, "session.turns": 1},
    "completions": {"request.chars": 6, "request.turns": 1, "request.tools": 0, "request.images": 0,
                    "request.stream": False, "session.turns": 0},
    "responses": {"request.chars": 9 + 4 + 2 + 9, "request.turns": 2, "request.tools": 1, "request.images": 1,
                  "request.stream": False, "session.turns": 1},
    "messages": {"request.chars": 9 + 4 + 2 + 9, "request.turns": 2, "request.tools": 1, "request.images": 0,
                 "request.stream": True, "session.turns": 1},
}  # fmt: skip


@pytest.mark.parametrize("api", list(CASES))
def test_each_adapter_computes_the_request_facts_from_its_body(api: str) -> None:
    adapter = API_BY_NAME[api]
    media = dataclasses_replace_hosts()
    state = adapter.state(CASES[api], StateSettings("last_user", 3), media)  # a tiny budget: facts see it all
    facts = request_facts(adapter, CASES[api], state)
    assert {name: facts[name] for name in EXPECTED[api]} == EXPECTED[api]
    assert facts["request.api"] == api and facts["request.videos"] == 0
    turns = len(state.turns)
    assert facts["request.tokens"] == estimate_tokens("\n".join(turn.shown for turn in state.turns), turns)


def dataclasses_replace_hosts() -> Any:
    import dataclasses

    return dataclasses.replace(DEFAULT_MEDIA, hosts=frozenset({"img.example.com"}))


@pytest.mark.parametrize(
    ("text", "turns", "expected"),
    [
        ("", 0, 0),
        ("abcd" * 10, 0, 10),  # ASCII: chars/4
        ("abcd" * 10, 3, 22),  # 4 a turn for the template's markers
        ("路由" * 10, 0, 12),  # 20 CJK characters: 5 + 40 extra bytes x 0.175 = 12 -> about 0.6 a character
        ("é" * 8, 0, 4),  # 2 + 8 x 0.175
    ],
)
def test_the_token_estimate(text: str, turns: int, expected: int) -> None:
    assert estimate_tokens(text, turns) == expected


# --- the middleware passes the same facts ---------------------------------------------------------------------------
async def test_the_middleware_decides_on_facts_without_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from d3backend import FakeEngine
    from router import D3RouterMiddleware

    async def handler(request: Request) -> JSONResponse:
        return JSONResponse({"rule": request.state.d3.decision.rule})

    for name, value in {"K_WEB": WEB, "K_NIGHTLY": NIGHTLY, "K_DEBUG": DEBUG}.items():
        monkeypatch.setenv(name, value)
    engine = FakeEngine({"jailbreak": 0.01})
    middleware = [Middleware(D3RouterMiddleware, config=parse_config(CONFIG, "c.yaml"), engine=engine)]
    app = Starlette(routes=[Route("/v1/chat/completions", handler, methods=["POST"])], middleware=middleware)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        long = await http.post(PATHS["chat"], json=body("chat", LONG), headers=key(WEB))
        batch = await http.post(PATHS["chat"], json=body("chat", "hi"), headers=key(NIGHTLY))
        assert (long.json(), batch.json()) == ({"rule": "long-context"}, {"rule": "batch"})
        assert engine.calls == []
        web = await http.post(PATHS["chat"], json=body("chat", "hi"), headers=key(WEB))
        assert web.json() == {"rule": "default"} and len(engine.calls) == 1


async def test_the_decision_log_carries_the_facts_and_no_answers() -> None:
    import io

    from d3backend import FakeEngine
    from router._decision.service import RouterService

    log = io.StringIO()
    engine = FakeEngine({"jailbreak": 0.01})
    service = RouterService(parse_config(CONFIG, "c.yaml"), engine, decision_log=log)
    d3 = await service.decide(service.config.policies["auto"], body("chat", LONG), caller="key:web")
    line = json.loads(log.getvalue())
    assert (line["rule"], line["answers"], line["skipped"]) == ("long-context", {}, ["jailbreak"])
    assert line["facts"] == dict(d3.facts) and line["facts"]["caller.name"] == ""  # no caller facts given: empty
    assert engine.calls == [] and d3.engine_calls == 0


def test_an_anonymous_callers_facts_are_empty_and_its_budget_unused() -> None:
    assert caller_facts(None, None) == {"caller.name": "", "caller.group": "", "budget.used": 0.0}
    assert caller_facts("web", "batch") == {"caller.name": "web", "caller.group": "batch", "budget.used": 0.0}
