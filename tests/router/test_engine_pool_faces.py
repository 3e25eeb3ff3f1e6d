"""Engine pools seen from outside (issue 28): `/v1/decisions` takes the pool's own name or one of its engines'
models; /metrics shows each engine's failures and whether it is set aside, and the URLs of its remote engines; an
embedded engine in a pool is refused at load; `d3router calibrate --engine NAME` asks that engine alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import respx

from d3backend import CachedEngine, DecisionsEngine, FailoverEngine, FakeEngine, RemoteEngine
from policies import Config, ConfigError, EngineSettings, parse_config
from router import create_app
from router._cli.main import main
from router._offline import commands as _replaycmd
from tests.decisions_server import DecisionsServer
from tests.router.test_engine_pool_kinds import CONFIG
from tests.router.test_replay import CONFIG as REPLAY
from tests.router.test_replay import answers_from_text, files

pytestmark = pytest.mark.anyio

QUESTION = {"type": "predicate", "name": "sql", "instructions": "Is this about SQL?"}


class D3:
    """The pool's first engine: answers 0.3, or refuses connections while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.down:
            raise httpx.ConnectError("refused")
        answer = {"type": "noul", "noul": 0.3, "probabilities": {"yes": 0.3, "no": 0.7}, "confidence": 0.7}
        return httpx.Response(
            200,
            json={
                "id": "d-1",
                "object": "structured_decision",
                "created": 1,
                "model": "d3",
                "answers": {"sql": answer},
                "usage": {"input_tokens": 5, "output_tokens": 0},
            },
        )


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, D3, DecisionsServer]]:
    d3, server = D3(), DecisionsServer({"sql": 0.8})
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://d3.test/v1/systemone").mock(side_effect=d3)
        remote = RemoteEngine(["http://d3.test"], model="d3", transport=httpx.MockTransport(mock.async_handler))
        hosted = DecisionsEngine("http://luna.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server))
        async with CachedEngine(FailoverEngine([("d3", remote), ("luna", hosted)])) as engine:
            app = create_app(parse_config(CONFIG), engine=engine, transport=httpx.AsyncHTTPTransport())
            try:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as http:
                    yield http, d3, server
            finally:
                await app.aclose()


def ask(model: str, text: str = "x") -> dict[str, object]:
    return {"model": model, "input": text, "questions": [QUESTION]}


async def test_v1_decisions_takes_the_pools_name_or_one_engines_model(
    served: tuple[httpx.AsyncClient, D3, DecisionsServer],
) -> None:
    http, _, _ = served
    pooled = await http.post("/v1/decisions", json=ask("pool(d3,luna-test)"))
    assert (pooled.json()["model"], pooled.json()["answers"][0]["probability"]) == ("d3", pytest.approx(0.3))
    hosted = await http.post("/v1/decisions", json=ask("luna-test"))  # the same input: not the pool's cached answer
    assert (hosted.json()["model"], hosted.json()["answers"][0]["probability"]) == ("luna-test", pytest.approx(0.8))
    first = await http.post("/v1/decisions", json=ask("d3"))
    assert first.json()["answers"][0]["probability"] == pytest.approx(0.3)
    unknown = await http.post("/v1/decisions", json=ask("gpt-6-luna"))
    assert unknown.status_code == 404 and "'pool(d3,luna-test)' or 'd3' or 'luna-test'" in unknown.text


async def test_one_engines_model_is_answered_by_it_alone(served: tuple[httpx.AsyncClient, D3, DecisionsServer]) -> None:
    http, d3, _ = served
    d3.down = True
    named = await http.post("/v1/decisions", json=ask("d3", "down"))
    assert named.status_code == 503  # no failover to another model's probabilities
    pooled = await http.post("/v1/decisions", json=ask("pool(d3,luna-test)", "down"))
    assert pooled.status_code == 200 and pooled.json()["model"] == "luna-test"  # the pool fails over


async def test_metrics_show_each_engines_failures_set_aside_and_urls(
    served: tuple[httpx.AsyncClient, D3, DecisionsServer],
) -> None:
    http, d3, _ = served
    d3.down = True
    assert (await http.post("/v1/decisions", json=ask("pool(d3,luna-test)"))).status_code == 200
    shown = (await http.get("/metrics")).text
    assert 'd3router_engine_pool_failures_total{engine="d3"} 1.0' in shown
    assert 'd3router_engine_pool_failures_total{engine="luna"} 0.0' in shown
    assert 'd3router_engine_pool_set_aside{engine="d3"} 1.0' in shown
    assert 'd3router_engine_pool_set_aside{engine="luna"} 0.0' in shown
    assert 'd3router_engine_url_requests_total{result="error",url="http://d3.test"}' in shown
    assert 'd3router_engine_answers_total{engine="luna"} 1.0' in shown
    again = (await http.get("/metrics")).text  # a second scrape adds nothing that did not grow
    assert 'd3router_engine_pool_failures_total{engine="d3"} 1.0' in again


def test_an_embedded_engine_in_a_pool_is_refused_at_load() -> None:
    text = CONFIG.replace("    - remote: {urls: [\"http://d3.test\"], model: d3, timeout_s: 1}\n      name: d3\n",
                          "    - embedded: {model: vllm-sr/d3-mini}\n")  # fmt: skip
    assert "embedded" in text
    with pytest.raises(ConfigError, match=r"engine\.pool\[0\]: an embedded engine cannot be one of engine\.pool's"):
        parse_config(text, "pool.yaml")


# --- d3router calibrate --engine NAME -----------------------------------------------------------------------------
POOL = """engine:
  pool:
    - remote: {urls: ["http://127.0.0.1:9"], model: d3}
      name: d3
    - decisions: {url: "http://127.0.0.1:9/v1", model: luna-test}
      name: luna
      max_choice_options: 26
"""


def test_calibrate_asks_one_engine_of_the_pool_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    opened: list[EngineSettings] = []

    async def open_engine(config: Config) -> FakeEngine:
        opened.append(config.engine)
        return FakeEngine(answers_from_text)

    monkeypatch.setattr(_replaycmd, "_open", open_engine)
    config_file, traffic = files(tmp_path, REPLAY.replace('engine:\n  remote: {urls: ["http://127.0.0.1:9"]}\n', POOL))
    assert main(["calibrate", config_file, traffic, "--rule", "refuse-jailbreak", "--engine", "luna"]) == 0
    assert "chosen: jailbreak > 0.675" in capsys.readouterr().out
    (alone,) = opened
    assert (alone.kind, alone.decisions and alone.decisions.model, alone.max_choice_options) == (
        "decisions", "luna-test", 26)  # fmt: skip
    assert main(["calibrate", config_file, traffic, "--rule", "refuse-jailbreak", "--engine", "gpt"]) == 2
    refused = capsys.readouterr().err
    assert "error: --engine 'gpt' names no engine of engine.pool in " in refused and "its engines: d3, luna" in refused
    lone_file, _ = files(tmp_path, REPLAY)
    assert main(["calibrate", lone_file, traffic, "--rule", "refuse-jailbreak", "--engine", "d3"]) == 2
    assert "has a remote engine alone; leave --engine out" in capsys.readouterr().err
