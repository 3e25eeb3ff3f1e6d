"""Shadow policies (issue 13): evaluated on the same request and answers, never acted on, counted and logged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from d3backend import FakeEngine
from policies import ConfigError, parse_config
from router import create_app

pytestmark = pytest.mark.anyio

# expose_decisions: the tests read x-d3-rule, a debug header (closed by default, issue 25.4).
CONFIG = """
server: {{decision_log: {{path: "{log}"}}, expose_decisions: true}}
upstreams:
  small: {{url: http://small.test/v1, model: small-model}}
  large: {{url: http://large.test/v1, model: big-model}}
policies:
  auto:
    {shadow}
    questions: {{jailbreak: {{type: noul}}, kind: {{type: choice, criteria: {{code: null, chat: null}}}}}}
    rules:
      - {{name: guard, when: jailbreak > 0.9, block: {{status: 403}}}}
      - {{name: code, when: kind == "code", route: large}}
      - {{name: default, route: small}}
  auto-v2:
    questions: {{jailbreak: {{type: noul}}, kind: {{type: choice, criteria: {{code: null, chat: null}}}}}}
    rules:
      - {{name: strict-guard, when: jailbreak > 0.5, block: {{status: 403}}}}
      - {{name: all-to-large, route: large}}
  needs-more:
    questions: {{difficulty: {{type: score, criteria: [easy, hard]}}}}
    rules:
      - {{name: hard, when: difficulty >= 0.5, route: large}}
      - {{name: easy, route: small}}
"""


def answers(state: Any, questions: Any) -> dict[str, Any]:
    text = str(state)
    table = {"jailbreak": 0.7 if "edgy" in text else 0.01, "kind": "code" if "python" in text else "chat",
             "difficulty": 0.9}  # fmt: skip
    return {qid: table.get(qid, 0.5) for qid in questions}  # `ready`: the startup probe


async def run(tmp_path: Path, shadow: str, texts: list[str]) -> tuple[list[Any], list[Any], Any, FakeEngine]:
    """Send `texts` through the proxy; return the responses, the upstream requests, the app and the engine."""
    log = tmp_path / f"decisions-{shadow or 'none'}.jsonl"
    config = parse_config(CONFIG.format(log=log, shadow=f"shadow: {shadow}" if shadow else ""), "c.yaml")
    engine = FakeEngine(answers)
    sent: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"ok": True})

    with respx.mock() as mock:
        mock.route(host__in=["small.test", "large.test"]).mock(side_effect=upstream)
        app = create_app(config, engine=engine, transport=httpx.AsyncHTTPTransport())
        await app.startup()
        async with app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            responses = []
            for text in texts:
                body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
                responses.append(await client.post("/v1/chat/completions", json=body))
            while app.service.shadows.pending:  # the background shadow decisions, if any
                await asyncio.sleep(0.01)
            metrics = app.service.metrics.render()
    engine.calls[:] = [call for call in engine.calls if call[0] != "probe"]
    return responses, sent, (metrics, log.read_text().splitlines()), engine


def shadow_counts(metrics: str) -> dict[tuple[str, str, str], float]:
    """`d3router_shadow_decisions_total` as (live rule, shadow rule, agree) -> count."""
    counts = {}
    for line in metrics.splitlines():
        if line.startswith("d3router_shadow_decisions_total{"):
            labels, value = line.removeprefix("d3router_shadow_decisions_total{").split("} ")
            pairs = dict(pair.split("=", 1) for pair in labels.split(","))
            found = {key: text.strip('"') for key, text in pairs.items()}
            assert (found["policy"], found["shadow"]) == ("auto", "auto-v2")
            counts[(found["rule"], found["shadow_rule"], found["agree"])] = float(value)
    return counts


TEXTS = ["hello", "write python", "something edgy", "ignore"]


VARYING = ("x-d3-decision-ms", "x-request-id", "traceparent")  # a time, and ids made per request


def sent_as(request: httpx.Request) -> tuple[Any, ...]:
    return request.url, [(k, v) for k, v in request.headers.multi_items() if k not in VARYING], request.content


def comparable(response: httpx.Response) -> tuple[int, bytes, list[tuple[str, str]]]:
    headers = [(k, v) for k, v in response.headers.multi_items() if k not in VARYING]
    return response.status_code, response.content, headers


async def test_a_shadow_changes_nothing_the_client_or_upstream_sees_and_costs_no_engine_call(tmp_path: Path) -> None:
    plain, plain_sent, _, plain_engine = await run(tmp_path, "", TEXTS)
    shadowed, shadow_sent, (metrics, log), engine = await run(tmp_path, "auto-v2", TEXTS)
    assert [comparable(r) for r in shadowed] == [comparable(r) for r in plain]
    assert [sent_as(r) for r in shadow_sent] == [sent_as(r) for r in plain_sent]
    assert len(engine.calls) == len(plain_engine.calls) == len(TEXTS)  # the questions overlap: no second call
    assert shadow_counts(metrics) == {
        ("default", "all-to-large", "no"): 2.0,  # hello, ignore: the shadow sends everything to large
        ("code", "all-to-large", "yes"): 1.0,
        ("default", "strict-guard", "no"): 1.0,  # edgy: 0.7 is over the shadow's stricter guard
    }
    entries = [json.loads(line) for line in log]
    assert [(e["rule"], e["shadow"]["rule"], e["shadow"]["agrees"]) for e in entries] == [
        ("default", "all-to-large", False), ("code", "all-to-large", True), ("default", "strict-guard", False),
        ("default", "all-to-large", False),
    ]  # fmt: skip


async def test_a_shadow_with_questions_of_its_own_asks_them_after_the_response(tmp_path: Path) -> None:
    responses, _, (metrics, log), engine = await run(tmp_path, "needs-more", ["hello"])
    assert responses[0].headers["x-d3-rule"] == "default"
    assert [set(call[1]) for call in engine.calls] == [{"jailbreak", "kind"}, {"difficulty"}]
    assert 'd3router_shadow_engine_calls_total{shadow="needs-more"} 1.0' in metrics
    entries = [json.loads(line) for line in log]
    assert "shadow" not in entries[0]  # the live line is written at once, without waiting
    assert entries[1]["shadow"] == {"policy": "needs-more", "rule": "hard", "action": "route",
                                    "upstreams": ["large"], "agrees": False}  # fmt: skip


@pytest.mark.parametrize("shadow", ["auto", "nope"])
def test_a_shadow_must_name_another_policy(tmp_path: Path, shadow: str) -> None:
    with pytest.raises(ConfigError, match=r"policies\.auto\.shadow: the shadow must be another policy"):
        parse_config(CONFIG.format(log=tmp_path / "x", shadow=f"shadow: {shadow}"), "c.yaml")
