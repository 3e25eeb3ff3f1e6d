"""`POST /v1/decisions` and `POST /v1/systemone` served by the router for applications: the real `openai` SDK's
`client.decisions.create` (in process, through httpx2's ASGI transport) and d3backend's own `RemoteEngine` get typed
answers from the router's engine, through its cache, with its errors in the OpenAI shape."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types import Decision

from d3backend import (
    CachedEngine,
    Choice,
    ChoiceAnswer,
    DecisionsEngine,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    FailoverEngine,
    FakeEngine,
    Noul,
    RemoteEngine,
    Score,
    ScoreAnswer,
)
from policies import parse_config
from router import create_app
from router._faces.proxy import ProxyApp
from tests.decisions_server import DecisionsServer

pytestmark = pytest.mark.anyio

CONFIG = """
server: {media_hosts: [img.test]}
upstreams: {small: {url: "http://small.test/v1"}}
policies:
  auto:
    questions: {j: {type: noul}}
    rules: [{name: guard, when: j > 0.9, block: {}}, {name: default, route: small}]
"""
TABLE = {"jailbreak": 0.25, "kind": {"code": 0.6, "chat": 0.4}, "difficulty": 2.5, "q3": True}
QUESTIONS: list[Any] = [
    {"type": "predicate", "name": "jailbreak", "instructions": "Is the user trying to get around the rules?"},
    {"type": "choice", "name": "kind", "instructions": "What kind of work is this?",
     "choices": [{"value": "code", "description": "Writing code"}, {"value": "chat"}]},
    {"type": "score", "name": "difficulty", "instructions": "How hard is it?",
     "levels": [{"label": "trivial"}, {"label": "easy"}, {"label": "hard", "description": "Needs an expert"},
                {"label": "expert"}]},
]  # fmt: skip


def app_with(engine: Any) -> ProxyApp:
    return create_app(parse_config(CONFIG), engine=engine)


@pytest.fixture
async def sdk() -> AsyncIterator[tuple[openai.AsyncOpenAI, FakeEngine]]:
    """The real SDK against the router in process; the router's engine a table (behind the cache)."""
    fake = FakeEngine(TABLE, model="d3-test")
    app = app_with(CachedEngine(fake))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as http:
        yield openai.AsyncOpenAI(base_url="http://router/v1", api_key="unused", http_client=http, max_retries=0), fake
    await app.aclose()


async def test_the_sdk_gets_typed_answers_in_question_order(sdk: tuple[openai.AsyncOpenAI, FakeEngine]) -> None:
    client, fake = sdk
    decision = await client.decisions.create(model="d3-test", input="Fix my SQL query", questions=QUESTIONS)
    assert isinstance(decision, Decision) and decision.model == "d3-test"
    predicate, choice, score = decision.answers
    assert predicate.type == "predicate" and predicate.name == "jailbreak" and predicate.probability == 0.25
    assert choice.type == "choice" and choice.choice == "code" and choice.confidence == pytest.approx(0.6)
    assert [(p.value, p.probability) for p in choice.probabilities] == [("code", 0.6), ("chat", 0.4)]
    assert score.type == "score" and score.score == pytest.approx(2.5)
    assert [(p.value, p.label) for p in score.probabilities] == [
        (0, "trivial"),
        (1, "easy"),
        (2, "hard"),
        (3, "expert"),
    ]
    [(state, asked, images, videos)] = fake.calls
    assert (state, asked, images, videos) == ("Fix my SQL query", ("jailbreak", "kind", "difficulty"), (), ())


async def test_a_repeated_decision_is_a_cache_hit(sdk: tuple[openai.AsyncOpenAI, FakeEngine]) -> None:
    client, fake = sdk
    for _ in range(2):
        raw = await client.decisions.with_raw_response.create(model="d3-test", input="same", questions=QUESTIONS[:1])
    assert len(fake.calls) == 1
    # Closed by default (issue 25.4): whether another caller sent the same input is not told.
    assert "x-d3-cache" not in raw.headers


async def test_the_cache_state_is_shown_with_expose_decisions() -> None:
    # server.expose_decisions (or a debug key) shows x-d3-cache, as on the decided endpoints.
    fake = FakeEngine(TABLE, model="d3-test")
    app = create_app(parse_config(CONFIG.replace("server: {", "server: {expose_decisions: true, ")),
                     engine=CachedEngine(fake))  # fmt: skip
    body = {"model": "d3-test", "input": "same", "questions": QUESTIONS[:1]}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            first, second = [await http.post("/v1/decisions", json=body) for _ in range(2)]
    finally:
        await app.aclose()
    assert (first.headers["x-d3-cache"], second.headers["x-d3-cache"]) == ("miss", "hit") and len(fake.calls) == 1


KEYED = CONFIG.replace(
    "server: {media_hosts: [img.test]}",
    """server:
  media_hosts: [img.test]
  auth:
    keys:
      - {name: app, key_env: KEY_APP, rate: {requests: 2, window_s: 60}}
      - {name: debugger, key_env: KEY_DEBUG, debug: true}""",
)
SYSTEMONE = {"model": "d3-test", "state": "x", "questions": {"jailbreak": {"type": "noul"}}}
DECISIONS = {"model": "d3-test", "input": "x", "questions": QUESTIONS[:1]}


@pytest.mark.parametrize(("path", "body"), [("/v1/decisions", DECISIONS), ("/v1/systemone", SYSTEMONE)])
async def test_with_keys_both_need_a_key_and_count_against_its_rate(path: str, body: dict[str, Any]) -> None:
    """Not public paths (issue 25.1): no key or a wrong one is a 401 before the engine is asked; a key's rate
    limit holds (429 with Retry-After); only a debug key sees x-d3-cache."""
    fake = FakeEngine(TABLE, model="d3-test")
    environ = {"KEY_APP": "sk-app-0123456789abcdef", "KEY_DEBUG": "sk-debug-0123456789abcdef"}
    app = create_app(parse_config(KEYED), engine=CachedEngine(fake), environ=environ)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            none = await http.post(path, json=body)
            wrong = await http.post(path, json=body, headers={"authorization": "Bearer sk-wrong-0123456789abcdef"})
            assert not fake.calls
            key = {"authorization": "Bearer sk-app-0123456789abcdef"}
            ok = [await http.post(path, json=body, headers=key) for _ in range(2)]
            over = await http.post(path, json=body, headers=key)
            debug = await http.post(path, json=body, headers={"x-api-key": "sk-debug-0123456789abcdef"})
    finally:
        await app.aclose()
    for refused in (none, wrong):
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert [r.status_code for r in ok] == [200, 200] and all("x-d3-cache" not in r.headers for r in ok)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert over.json()["error"]["type"] == "rate_limit_error"
    assert debug.status_code == 200 and debug.headers["x-d3-cache"] == "hit"


async def test_messages_tool_calls_images_and_json_become_the_state(sdk: tuple[openai.AsyncOpenAI, FakeEngine]) -> None:
    client, fake = sdk
    items: list[Any] = [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                         {"type": "input_image", "image_url": "https://img.test/a.png"},
                                                         {"type": "input_json", "data": {"id": 7}}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"id": 7}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a cat"},
    ]  # fmt: skip
    await client.decisions.create(model="d3-test", input=items, questions=[{"type": "predicate", "instructions": "?"}])
    [(state, asked, images, _)] = fake.calls
    assert state == ('system: Be brief.\n\nuser: What is this?\n{"id": 7}\n\nassistant: [tool call] lookup({"id": 7})'
                     "\n\ntool: a cat")  # fmt: skip
    assert (asked, images) == (("q0",), ("https://img.test/a.png",))


@pytest.mark.parametrize(
    ("change", "status", "match"),
    [
        ({"model": "gpt-6-luna"}, 404, r"^the model 'gpt-6-luna' does not exist; this router's decision engine serves"),
        ({"input": [{"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": "https://evil.test/x.png"}]}]}, 400,
         r"^an input image or video is refused: host evil.test not in server.media_hosts$"),
        ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "only"}]}]}, 400,
         r"^question 'q0' has 1 choices; expected 2 to 255$"),
        ({"questions": [QUESTIONS[0], QUESTIONS[0]]}, 400, r"^the question name 'jailbreak' is used twice"),
        ({"questions": [{"type": "predicate", "instructions": "?", "criteria": {}}]}, 400,
         r"^the request body is invalid at questions.0.criteria: Extra inputs are not permitted$"),
    ],
)  # fmt: skip
async def test_what_the_router_cannot_ask_is_an_openai_shaped_error(
    sdk: tuple[openai.AsyncOpenAI, FakeEngine], change: dict[str, Any], status: int, match: str
) -> None:
    client, fake = sdk
    request: dict[str, Any] = {"model": "d3-test", "input": "x", "questions": QUESTIONS, **change}
    with pytest.raises(openai.APIStatusError, match=r".") as info:
        await client.decisions.create(**request)
    assert info.value.status_code == status
    assert re.search(match, info.value.body["message"]), info.value.body  # type: ignore[index]
    assert not fake.calls


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (EngineTimeout("the engine at http://10.0.0.7:8000 did not answer within 2 s"), 504,
         "the decision engine did not answer in time"),
        (EngineUnavailable("cannot reach the engine at http://10.0.0.7:8000"), 503, "cannot reach the decision engine"),
        (EngineError("http://10.0.0.7:8000 answered 200 with no answers"), 502,
         "the decision engine gave an answer that could not be read"),
    ],
)  # fmt: skip
async def test_an_engine_failure_is_its_status_naming_no_engine_url(
    error: EngineError, status: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_with(FakeEngine(error=error, model="d3-test"))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            response = await http.post("/v1/decisions", json={"model": "d3-test", "input": "x", "questions": QUESTIONS})
            metrics = (await http.get("/metrics")).text
    finally:
        await app.aclose()
    assert response.status_code == status and response.json()["error"]["message"] == message
    assert "10.0.0.7" not in response.text, "the deployment's addresses are the operator's"
    assert "10.0.0.7" in caplog.text, "the operator's log has the detail"
    assert f'd3router_engine_errors_total{{kind="{type(error).__name__}"}} 1.0' in metrics


async def test_a_refusal_from_a_decisions_engine_behind_is_served_as_a_refusal() -> None:
    server = DecisionsServer({"jailbreak": "refuse", "kind": "chat"}, model="luna-test")
    engine = DecisionsEngine("http://luna.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server))
    app = app_with(CachedEngine(engine))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            body = {"model": "luna-test", "input": "x", "questions": QUESTIONS[:2], "prompt_cache_key": "tenant-7"}
            response = await http.post("/v1/decisions", json=body)
    finally:
        await app.aclose()
    decision = Decision.model_validate(response.json())
    assert [answer.type for answer in decision.answers] == ["refusal", "choice"]
    assert decision.answers[0].name == "jailbreak" and decision.usage.input_tokens_details.cached_tokens == 100
    assert server.requests[0]["prompt_cache_key"] == "tenant-7"  # the client's key reaches the hosted model


@pytest.mark.parametrize(
    "engine",
    ['{decisions: {url: "http://127.0.0.1:9/v1", model: luna-test}}', '{remote: {urls: ["http://127.0.0.1:9"]}}',
     '{pool: [{remote: {urls: ["http://127.0.0.1:9"], model: d3}}, {decisions: {url: "http://127.0.0.1:9/v1", model: m}}]}'],
)  # fmt: skip
async def test_an_engine_the_configuration_sets_serves_applications_with_no_policy_asking(engine: str) -> None:
    """A router serving only /v1/decisions (no policy asks anything) still runs the engine its `engine` names: it
    answered 503 "no decision engine is configured" (found trying examples/pool.yaml's failover, issue 28.2)."""
    app = create_app(parse_config(f"engine: {engine}\nupstreams: {{none: {{url: http://127.0.0.1:9/v1}}}}\n"))
    try:
        assert isinstance(app.service.engine, CachedEngine)
    finally:
        await app.aclose()
    unset = create_app(parse_config("upstreams: {none: {url: http://127.0.0.1:9/v1}}\n"))
    try:
        assert unset.service.engine is None  # no engine named, no question asked: the embedded default is not started
    finally:
        await unset.aclose()


# --- /v1/systemone ---------------------------------------------------------------------------------------------------
async def test_systemone_serves_d3backends_own_remote_engine() -> None:
    fake = FakeEngine(TABLE, model="d3-test")
    app = app_with(fake)
    questions = {"jailbreak": Noul("?"), "kind": Choice(None, {"code": None, "chat": None}),
                 "difficulty": Score(None, ("trivial", "easy", "hard", "expert"))}  # fmt: skip
    try:
        async with RemoteEngine(["http://router"], model="d3-test", transport=httpx.ASGITransport(app=app)) as remote:
            decided = await remote.decide({"ticket": 7}, questions, images=("https://img.test/a.png",))
    finally:
        await app.aclose()
    kind, difficulty = decided.answers["kind"], decided.answers["difficulty"]
    assert isinstance(kind, ChoiceAnswer) and kind.choice == "code"
    assert isinstance(difficulty, ScoreAnswer) and difficulty.score == pytest.approx(2.5)
    assert fake.calls == [({"ticket": 7}, ("jailbreak", "kind", "difficulty"), ("https://img.test/a.png",), ())]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"model": "d3-test", "state": "x", "questions": {"a": {"type": "noul"}}, "instructions": "be nice"},
         r"^a top-level `instructions` is refused: d3's prompt is fixed$"),
        ({"model": "d3-test", "state": "x", "questions": {"a": {"type": "choice", "criteria": {"x": None}}}},
         r"^question 'a' is invalid: Value error|^question 'a' is invalid: a choice needs at least 2 options"),
        ({"model": "d3-test", "state": "x", "questions": {"a": {"type": "noul"}}, "videos": ["https://evil.test/v"]},
         r"^an input image or video is refused: host evil.test not in server.media_hosts$"),
        ({"model": "d3-test", "state": "x", "questions": {"a": {"type": "noul"}}, "joint": True},
         r"^the request body is invalid at joint: Extra inputs are not permitted$"),
    ],
)  # fmt: skip
async def test_systemone_refuses_what_d3_refuses(body: dict[str, Any], match: str) -> None:
    fake = FakeEngine(TABLE, model="d3-test")
    app = app_with(fake)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            response = await http.post("/v1/systemone", json=body)
    finally:
        await app.aclose()
    assert response.status_code == 400
    assert re.search(match, response.json()["error"]["message"]), response.json()
    assert not fake.calls


async def test_a_refusal_from_a_pools_engine_names_that_engine_to_a_debug_caller() -> None:
    """`x-d3-engine` names the pool's engine that refused as it names one that answered (it was missing, so a user of
    a pool could not tell which engine refused)."""
    server = DecisionsServer({"jailbreak": "refuse", "kind": "chat"}, model="luna-test")
    luna = DecisionsEngine("http://luna.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server))
    app = create_app(parse_config(CONFIG.replace("server: {", "server: {expose_decisions: true, ")),
                     engine=CachedEngine(FailoverEngine([("luna", luna)])))  # fmt: skip
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            response = await http.post("/v1/decisions", json={"model": "luna-test", "input": "x",
                                                              "questions": QUESTIONS[:2]})  # fmt: skip
    finally:
        await app.aclose()
    assert [answer["type"] for answer in response.json()["answers"]] == ["refusal", "choice"]
    assert response.headers["x-d3-engine"] == "luna"
