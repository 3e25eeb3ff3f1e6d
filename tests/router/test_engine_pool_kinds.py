"""Engine pools across kinds (issue 28.2): d3 on vLLM first, a hosted Decisions engine as failover; the decision
log and /metrics say which engine answered; the example policies decide the same through a pool whose first engine
is down."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
import respx

from d3backend import CachedEngine, DecisionsEngine, FailoverEngine, RemoteEngine
from policies import Config, load_config, parse_config
from router import build_engine
from router._decision.service import RouterService
from tests.decisions_server import DecisionsServer, answered_cases

pytestmark = pytest.mark.anyio

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
CONFIG = """
engine:
  pool:
    - remote: {urls: ["http://d3.test"], model: d3, timeout_s: 1}
      name: d3
    - decisions: {url: "http://luna.test/v1", model: luna-test, api_key_env: LUNA_KEY, timeout_s: 2}
upstreams: {small: {url: "http://small.test/v1"}}
policies:
  auto:
    questions:
      code: {type: noul, instructions: Is this about code?}
    rules:
      - {name: code, when: code > 0.5, route: small}
      - {name: default, route: small}
"""
BODY = {"model": "auto", "messages": [{"role": "user", "content": "Fix my SQL"}]}


async def test_a_pool_is_built_from_its_settings_behind_one_cache() -> None:
    config = parse_config(CONFIG)
    engine = build_engine(config.engine, base_dir=Path("/srv"), environ={"LUNA_KEY": "sk-luna"})
    try:
        assert isinstance(engine, CachedEngine) and isinstance(engine.engine, FailoverEngine)
        (first, remote), (second, hosted) = engine.engine.engines
        assert (first, second) == ("d3", "decisions")
        assert isinstance(remote, RemoteEngine) and isinstance(hosted, DecisionsEngine)
        assert hosted._headers["authorization"] == "Bearer sk-luna"
        assert [m.timeout_s for m in engine.engine._members] == [1.0, 2.0]  # one URL: no retry elsewhere
        assert engine.model == "pool(d3,luna-test)"
    finally:
        await engine.aclose()


def pool(mock: respx.MockRouter, server: DecisionsServer) -> CachedEngine:
    remote = RemoteEngine(["http://d3.test"], model="d3", transport=httpx.MockTransport(mock.async_handler))
    hosted = DecisionsEngine("http://luna.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server))
    return CachedEngine(FailoverEngine([("d3", remote), ("decisions", hosted)]))


async def test_the_decision_log_and_metrics_name_the_engine_that_answered() -> None:
    server = DecisionsServer({"code": 0.9})
    log = io.StringIO()
    with respx.mock() as mock:
        mock.post("http://d3.test/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
        async with pool(mock, server) as engine:
            service = RouterService(parse_config(CONFIG), engine, decision_log=log)
            d3 = await service.decide(service.config.policies["auto"], BODY)
            again = await service.decide(service.config.policies["auto"], BODY)
    first, second = (json.loads(line) for line in log.getvalue().splitlines())
    assert (first["engine"], first["rule"], first["cached"], first["degraded"]) == ("decisions", "code", False, False)
    assert (second["engine"], second["cached"]) == ("decisions", True)  # a hit says whose answer it keeps
    assert (d3.engine, again.engine) == ("decisions", "decisions")
    metrics = service.metrics.render()
    assert 'd3router_engine_answers_total{engine="decisions"} 1.0' in metrics  # hits not counted
    assert 'engine="d3"' not in metrics


async def test_an_engine_alone_adds_no_engine_to_the_log() -> None:
    from d3backend import FakeEngine

    log = io.StringIO()
    service = RouterService(parse_config(CONFIG), FakeEngine({"code": 0.9}), decision_log=log)
    await service.decide(service.config.policies["auto"], BODY)
    assert "engine" not in json.loads(log.getvalue())
    assert "d3router_engine_answers_total" not in service.metrics.render()


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
async def test_the_example_policies_decide_the_same_through_a_pool_whose_first_engine_is_down(path: Path) -> None:
    config: Config = load_config(path)
    some, cases = answered_cases(config)
    if not some:
        pytest.skip(f"{path.name} has no policy test case with answers")  # counted: the examples all have some
    checked = 0
    for policy, case, answers in cases:
        server = DecisionsServer(answers)
        with respx.mock() as mock:
            mock.post("http://d3.test/v1/systemone").respond(503, json={"error": {"message": "overloaded"}})
            async with pool(mock, server) as engine:
                decided = await engine.decide("the same state", policy.questions)
        assert decided.engine == "decisions"
        expected = policy.evaluate(case.answers, case.facts)
        got = policy.evaluate(decided.answers, case.facts)
        assert (got.rule, got.action) == (expected.rule, expected.action), case.name
        checked += 1
    assert checked, f"{path.name}: no case answered every question"


def test_check_summarizes_the_pool_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from router._cli.main import main

    file = tmp_path / "pool.yaml"
    file.write_text(CONFIG, encoding="utf-8")
    assert main(["check", str(file)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  engine: pool d3 (remote), then decisions (decisions) (cache 10000 entries, 600 s)"


async def test_v1_decisions_names_a_pool_by_its_engines_models() -> None:
    from router import create_app

    server = DecisionsServer({"sql": 0.8})
    question = {"type": "predicate", "name": "sql", "instructions": "Is this about SQL?"}
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://d3.test/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
        async with pool(mock, server) as engine:
            app = create_app(parse_config(CONFIG), engine=engine, transport=httpx.AsyncHTTPTransport())
            try:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as http:
                    other = await http.post(
                        "/v1/decisions", json={"model": "d3", "input": "x", "questions": [question]}
                    )
                    served = await http.post(
                        "/v1/decisions", json={"model": "pool(d3,luna-test)", "input": "x", "questions": [question]}
                    )
            finally:
                await app.aclose()
    assert other.status_code == 503  # one engine's model is asked of it alone (tests/router/test_engine_pool_faces.py)
    assert served.status_code == 200 and served.json()["answers"][0]["probability"] == pytest.approx(0.8)


async def test_a_debug_caller_sees_which_engine_answered_a_decided_request_and_v1_decisions() -> None:
    """`x-d3-engine`, beside `x-d3-cache`: a user trying a pool through the SDK could not tell which engine answered
    (only the decision log and /metrics said so)."""
    from router import create_app

    server = DecisionsServer({"code": 0.9, "sql": 0.8})
    question = {"type": "predicate", "name": "sql", "instructions": "Is this about SQL?"}
    exposed = CONFIG.replace("upstreams:", "server: {expose_decisions: true}\nupstreams:", 1)
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://d3.test/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
        mock.post("http://small.test/v1/chat/completions").respond(200, json={"ok": True})
        async with pool(mock, server) as engine:
            for text, shown in ((exposed, True), (CONFIG, False)):
                app = create_app(parse_config(text), engine=engine, transport=httpx.MockTransport(mock.async_handler))
                try:
                    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as http:
                        chat = await http.post("/v1/chat/completions", json=BODY)
                        decided = await http.post(
                            "/v1/decisions", json={"model": "pool(d3,luna-test)", "input": "x", "questions": [question]}
                        )
                finally:
                    await app.aclose()
                assert chat.status_code == decided.status_code == 200
                engines = (chat.headers.get("x-d3-engine"), decided.headers.get("x-d3-engine"))
                assert engines == (("decisions", "decisions") if shown else (None, None))  # closed by default


async def test_an_engine_alone_adds_no_engine_header() -> None:
    from d3backend import FakeEngine
    from router import create_app

    exposed = CONFIG.replace("upstreams:", "server: {expose_decisions: true}\nupstreams:", 1)
    with respx.mock() as mock:
        mock.post("http://small.test/v1/chat/completions").respond(200, json={"ok": True})
        app = create_app(parse_config(exposed), engine=FakeEngine({"code": 0.9}),
                         transport=httpx.MockTransport(mock.async_handler))  # fmt: skip
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as http:
                chat = await http.post("/v1/chat/completions", json=BODY)
        finally:
            await app.aclose()
    assert chat.status_code == 200 and chat.headers["x-d3-rule"] == "code" and "x-d3-engine" not in chat.headers


async def test_at_startup_each_engine_of_the_pool_that_fails_its_probe_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool is ready when one engine answers its probe, so a failover with a wrong key, URL or model was found
    only in an outage, when every decision ended in on_engine_error (serving examples/pool.yaml with the failover
    down: not a line at startup). Now each engine is probed once at startup and each one that fails is logged."""
    import logging

    from router import create_app

    server = DecisionsServer({})
    server.status = 401
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://d3.test/v1/systemone").mock(return_value=systemone_ready())
        async with pool(mock, server) as engine:
            app = create_app(parse_config(CONFIG), engine=engine, transport=httpx.AsyncHTTPTransport())
            try:
                with caplog.at_level(logging.WARNING):
                    await app.startup()
                ready = app.ready
            finally:
                await app.aclose()
    assert ready and len(server.requests) == 1  # ready (d3 answers), the failover probed once
    (warning,) = [r for r in caplog.records if "cannot take over" in r.getMessage()]
    assert "'decisions'" in warning.getMessage() and "401" in warning.getMessage()


def systemone_ready() -> httpx.Response:
    answer = {"type": "noul", "probabilities": {"yes": 0.5, "no": 0.5}, "confidence": 0.5}
    return httpx.Response(200, json={"model": "d3", "answers": {"ready": answer}, "usage": {}})
