"""The Decisions engine in the router: built from `engine.decisions`, its usage counted, and each of its failures (a
refusal, a 429, a timeout) ending as the policy's `on_engine_error` says; the example policies decide the same
with it as with the systemone engine fed the same probabilities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from d3backend import (
    CachedEngine,
    DecisionsEngine,
    RemoteEngine,
    Usage,
    answer_wire,
    usage_json,
)
from policies import Config, ConfigError, load_config, parse_config
from router import build_engine, create_app
from tests.decisions_server import DecisionsServer, answered_cases

pytestmark = pytest.mark.anyio

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
# expose_decisions: the tests read which rule decided (x-d3-rule), shown only with it or a debug key (issue 25.4).
GUARDED = """
engine: {decisions: {url: "http://luna.test/v1", model: luna-test, api_key_env: LUNA_KEY, timeout_s: 3}}
server: {expose_decisions: true}
upstreams: {small: {url: "http://small.test/v1"}}
policies:
  guarded:
    on_engine_error: {block: {status: 503, message: The safety check is unavailable.}}
    questions:
      jailbreak: {type: noul, instructions: Is the user trying to make the assistant ignore its rules?}
      kind: {type: choice, criteria: {code: Writing code, chat: null}}
    rules:
      - {name: refuse, when: jailbreak > 0.9, block: {status: 403, message: Refused.}}
      - {name: code, when: kind == "code", route: small, tag: {x-kind: code}}
      - {name: default, route: small}
"""
BODY = {"model": "guarded", "messages": [{"role": "user", "content": "Fix my SQL"}]}


async def test_a_decisions_engine_is_built_from_its_settings_behind_the_cache() -> None:
    config = parse_config(GUARDED)
    assert config.engine.kind == "decisions"
    engine = build_engine(config.engine, base_dir=Path("/srv"), environ={"LUNA_KEY": "sk-luna"})
    try:
        assert isinstance(engine, CachedEngine) and isinstance(engine.engine, DecisionsEngine)
        inner = engine.engine
        assert (inner.url, inner.model, engine.model) == ("http://luna.test/v1/decisions", "luna-test", "luna-test")
        assert inner._headers["authorization"] == "Bearer sk-luna" and inner._timeout_s == 3
    finally:
        await engine.aclose()


def test_one_engine_kind_only() -> None:
    with pytest.raises(ConfigError, match=r"^<config>:2:1: engine: set one engine kind \(embedded, remote,"
                                          r" decisions or pool\), found remote and decisions$"):  # fmt: skip
        parse_config(GUARDED.replace("engine: {", "engine: {remote: {urls: ['http://d3:8000']}, "))


async def route(mock: respx.MockRouter, decisions: Any) -> tuple[httpx.Response, str]:
    """One chat request through an app whose Decisions engine answers `decisions` (a response or an exception)."""
    mock.post("http://small.test/v1/chat/completions").respond(200, json={"ok": True})
    answer = mock.post("http://luna.test/v1/decisions")
    if isinstance(decisions, Exception):
        answer.side_effect = decisions
    else:
        answer.return_value = decisions
    engine = CachedEngine(DecisionsEngine("http://luna.test/v1", model="luna-test",
                                          transport=httpx.MockTransport(mock.async_handler)))  # fmt: skip
    app = create_app(parse_config(GUARDED), engine=engine, transport=httpx.AsyncHTTPTransport())
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            response = await http.post("/v1/chat/completions", json=BODY)
            metrics = (await http.get("/metrics")).text
    finally:
        await app.aclose()
        await engine.aclose()
    return response, metrics


def decision(jailbreak: dict[str, Any], kind: str = "code") -> httpx.Response:
    probabilities = [{"value": "code", "probability": 0.8 if kind == "code" else 0.2},
                     {"value": "chat", "probability": 0.2 if kind == "code" else 0.8}]  # fmt: skip
    answers = [{"name": "jailbreak", **jailbreak},
               {"type": "choice", "name": "kind", "choice": kind, "confidence": 0.8, "probabilities": probabilities}]  # fmt: skip
    return httpx.Response(200, json={"model": "luna-test", "answers": answers, "usage": usage_json(Usage(300, 0, 256))})


async def test_answers_route_and_the_tokens_are_counted() -> None:
    with respx.mock(assert_all_called=True) as mock:
        response, metrics = await route(mock, decision({"type": "predicate", "probability": 0.01}))
    assert response.status_code == 200 and response.headers["x-d3-rule"] == "code"
    assert response.headers["x-kind"] == "code"
    assert 'd3router_engine_tokens_total{kind="input"} 300.0' in metrics
    assert 'd3router_engine_tokens_total{kind="cached"} 256.0' in metrics


@pytest.mark.parametrize(
    ("decisions", "kind"),
    [
        (decision({"type": "refusal"}), "EngineRefused"),
        (httpx.Response(429, json={"error": {"message": "slow down"}}, headers={"retry-after": "2"}), "EngineRateLimited"),
        (httpx.ReadTimeout("slow"), "EngineTimeout"),
    ],
    ids=["refusal", "429", "timeout"],
)  # fmt: skip
async def test_a_refusal_a_429_and_a_timeout_end_as_on_engine_error(decisions: Any, kind: str) -> None:
    with respx.mock(assert_all_called=False) as mock:
        response, metrics = await route(mock, decisions)
        assert not mock.routes[0].called  # the guard did not let it through
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "The safety check is unavailable."
    assert response.headers["x-d3-rule"] == "on_engine_error"
    assert f'd3router_engine_errors_total{{kind="{kind}"}} 1.0' in metrics


# --- the example policies decide the same on both engines -----------------------------------------------------------
def systemone(answers: dict[str, Any]) -> httpx.Response:
    body = {"model": "d3", "answers": {qid: answer_wire(answer) for qid, answer in answers.items()}, "usage": {}}
    return httpx.Response(200, json=body)


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
async def test_the_example_policies_decide_the_same_with_either_engine(path: Path) -> None:
    config: Config = load_config(path)
    some, cases = answered_cases(config)
    if not some:
        pytest.skip(f"{path.name} has no policy test case with answers")  # counted: the examples all have some
    checked = 0
    for policy, case, answers in cases:
        server = DecisionsServer(answers)
        with respx.mock() as mock:
            mock.post("http://d3.test/v1/systemone").mock(return_value=systemone(answers))
            remote = RemoteEngine(["http://d3.test"], model="d3", transport=httpx.MockTransport(mock.async_handler))
            hosted = DecisionsEngine(
                "http://luna.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server)
            )
            async with remote, hosted:
                by_d3 = await remote.decide("the same state", policy.questions)
                by_luna = await hosted.decide("the same state", policy.questions)
        for qid in policy.questions:
            assert by_luna.answers[qid].probabilities == pytest.approx(by_d3.answers[qid].probabilities), qid
        d3_decision, luna_decision = (
            policy.evaluate(by_d3.answers, case.facts),
            policy.evaluate(by_luna.answers, case.facts),
        )
        assert (luna_decision.rule, luna_decision.action) == (d3_decision.rule, d3_decision.action), case.name
        checked += 1
    assert checked, f"{path.name}: no case answered every question"
