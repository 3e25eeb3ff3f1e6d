"""`d3router replay`: every figure of the report against hand-computed values, with a fake engine whose answers
are written in each request's text (`j=0.95 k=code d=2`: jailbreak, kind, difficulty)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from d3backend import EngineUnavailable, FakeEngine, JSONValue, Question
from policies import Config, load_config
from router._cli.main import main
from router._offline import commands as _replaycmd
from router._offline.replay import Outcome, read_traffic, replay
from router._offline.report import markdown, summarize

CONFIG = """upstreams:
  small: {url: http://127.0.0.1:8001/v1}
  large: {url: http://127.0.0.1:8002/v1}
engine:
  remote: {urls: ["http://127.0.0.1:9"]}
policies:
  auto:
    questions:
      jailbreak: {type: noul}
      kind: {type: choice, criteria: {code: null, chat: null}}
      difficulty: {type: score, criteria: [trivial, easy, hard, expert]}
    rules:
      # the guard's threshold
      - {name: refuse-jailbreak, when: jailbreak > 0.9, block: {status: 403, message: no}}
      - {name: hard, when: 'kind == "code" and difficulty >= 1.5', route: large}
      - {name: default, route: small}
"""


def body(text: str, model: str = "auto") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def labelled(text: str, **expect: Any) -> str:
    return json.dumps({"request": body(text), "expect": expect})


# line: text, label -> decision (by CONFIG)
TRAFFIC = [
    labelled("j=0.95 k=chat d=0", rule="refuse-jailbreak"),  # 1 refuse-jailbreak, right
    labelled("j=0.85 k=chat d=0", rule="refuse-jailbreak"),  # 2 default, wrong
    labelled("j=0.5 k=code d=2", rule="hard"),  # 3 hard, right
    labelled("j=0.1 k=code d=1", rule="hard"),  # 4 default, wrong
    labelled("j=0.1 k=chat d=3", rule="default"),  # 5 default, right
    labelled("j=0.92 k=chat d=0", rule="default"),  # 6 refuse-jailbreak, wrong
    labelled("j=0.0 k=code d=2.5", rule="hard"),  # 7 hard, right
    labelled("j=0.2 k=chat d=0", rule="default"),  # 8 default, right
    json.dumps(body("j=0.3 k=code d=3")),  # 9 hard, unlabelled
    labelled("j=0.1 k=code d=2", route="large"),  # 10 large, right
    labelled("j=0.97 k=chat d=0", block=True),  # 11 block, right
    "{not json",  # 12 skipped
    labelled("j=0.1 k=chat d=0", rule="nope"),  # 13 skipped: no such rule
    json.dumps(body("j=0.1 k=chat d=0", model="gpt-4o")),  # 14 no policy: passed through
]


def answers_from_text(state: JSONValue, questions: Mapping[str, Question]) -> dict[str, Any]:
    found = dict(re.findall(r"(\w)=(\S+)", str(state)))
    return {"jailbreak": float(found["j"]), "kind": found["k"], "difficulty": float(found["d"])}


def files(tmp_path: Path, config: str = CONFIG, traffic: list[str] = TRAFFIC) -> tuple[str, str]:
    (tmp_path / "router.yaml").write_text(config, encoding="utf-8")
    (tmp_path / "traffic.jsonl").write_text("\n".join(traffic) + "\n", encoding="utf-8")
    return str(tmp_path / "router.yaml"), str(tmp_path / "traffic.jsonl")


def run(config: Config, traffic: str, engine: FakeEngine, concurrency: int = 4) -> list[Outcome]:
    lines, _ = read_traffic(traffic, config)
    return asyncio.run(replay(config, lines, engine=engine, concurrency=concurrency))


def test_report_figures_by_hand(tmp_path: Path) -> None:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    lines, bad = read_traffic(traffic, config)
    assert [(b.line, b.error) for b in bad] == [
        (12, "not JSON (Expecting property name enclosed in double quotes at column 2)"),
        (13, "the label names rule 'nope', which policy 'auto' lacks; expected one of 'refuse-jailbreak', 'hard', "
         "'default'"),
    ]  # fmt: skip
    outcomes = asyncio.run(replay(config, lines, engine=FakeEngine(answers_from_text), concurrency=4))
    report = summarize(config, outcomes, bad)
    assert report["lines"] == 14
    assert report["decided"] == 11
    assert report["no_policy"] == [{"line": 14, "model": "gpt-4o"}]
    assert report["per_rule"] == {"default": 4, "hard": 4, "refuse-jailbreak": 3}
    assert report["per_upstream"] == {"small": 4, "large": 4}
    assert report["blocked"] == 3
    assert report["block_rate"] == pytest.approx(3 / 11)
    assert report["labelled"] == 10
    assert report["accuracy"] == pytest.approx(7 / 10)
    rules = report["confusion"]["rule"]
    assert rules["classes"] == ["default", "hard", "refuse-jailbreak"]
    assert rules["matrix"] == [[2, 0, 1], [1, 2, 0], [1, 0, 1]]
    assert rules["precision"] == pytest.approx({"default": 0.5, "hard": 1.0, "refuse-jailbreak": 0.5})
    assert rules["recall"] == pytest.approx({"default": 2 / 3, "hard": 2 / 3, "refuse-jailbreak": 0.5})
    routes = report["confusion"]["route"]
    assert (routes["classes"], routes["matrix"]) == (["block", "large"], [[1, 0], [0, 1]])
    assert routes["precision"] == routes["recall"] == {"block": 1.0, "large": 1.0}
    assert report["latency_ms"]["p50"] is not None and report["latency_ms"]["p95"] >= report["latency_ms"]["p50"]
    assert report["engine_errors"] == [] and report["retried"] == 0
    text = markdown(report)
    assert "**Accuracy 0.700** over 10 labelled lines." in text
    assert "| refuse-jailbreak | 1 | 0 | 1 | 0.500 | 0.500 |" in text
    assert "- skipped line 12: not JSON" in text
    assert "- line 14: model 'gpt-4o' names no policy" in text


def test_against_lists_exactly_the_changed_lines(tmp_path: Path) -> None:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    (tmp_path / "new.yaml").write_text(CONFIG.replace("jailbreak > 0.9", "jailbreak > 0.8"), encoding="utf-8")
    other = load_config(tmp_path / "new.yaml")
    before = run(config, traffic, FakeEngine(answers_from_text))
    after = run(other, traffic, FakeEngine(answers_from_text))
    report = summarize(config, before, against=(other, after))
    assert report["changed"] == {
        "count": 1,
        "pairs": {"default -> refuse-jailbreak": 1},
        "lines": [{"line": 2, "old": "default", "new": "refuse-jailbreak"}],
    }
    # a changed route under the same rule names the upstreams
    (tmp_path / "big.yaml").write_text(CONFIG.replace("route: small", "route: large"), encoding="utf-8")
    big = load_config(tmp_path / "big.yaml")
    change = summarize(config, before, against=(big, run(big, traffic, FakeEngine(answers_from_text))))["changed"]
    assert change["count"] == 4
    assert change["pairs"] == {"default (route small) -> default (route large)": 4}
    assert [item["line"] for item in change["lines"]] == [2, 4, 5, 8]


def test_concurrency_keeps_the_order_and_the_figures(tmp_path: Path) -> None:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    one = run(config, traffic, FakeEngine(answers_from_text, delay_s=0.001), concurrency=1)
    many = run(config, traffic, FakeEngine(answers_from_text, delay_s=0.001), concurrency=64)
    assert [(o.line.line, o.rule) for o in one] == [(o.line.line, o.rule) for o in many]


class Flaky(FakeEngine):
    """Fails the first call for each state in `fail_once`, and every call for the states in `fail_always`."""

    def __init__(self, fail_once: set[str], fail_always: set[str]) -> None:
        super().__init__(answers_from_text)
        self.fail_once, self.fail_always = fail_once, fail_always

    async def decide(self, state: JSONValue, questions: Mapping[str, Question], **media: Any) -> Any:
        if state in self.fail_always:
            raise EngineUnavailable("engine down")
        if state in self.fail_once:
            self.fail_once.discard(str(state))
            raise EngineUnavailable("engine hiccup")
        return await super().decide(state, questions, **media)


def test_engine_failures_are_retried_once_and_counted(tmp_path: Path) -> None:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    engine = Flaky(fail_once={"j=0.5 k=code d=2"}, fail_always={"j=0.95 k=chat d=0"})
    report = summarize(config, run(config, traffic, engine))
    assert report["engine_errors"] == [{"line": 1, "error": "engine down"}]
    assert report["retried"] == 2  # line 3 succeeded on its retry; line 1 failed twice
    assert report["decided"] == 11
    assert report["labelled"] == 9  # line 1 is left out of the accuracy: the engine never judged it
    assert report["accuracy"] == pytest.approx(6 / 9)


def test_decision_log_lines_replay(tmp_path: Path) -> None:
    lines = [
        {"policy": "auto", "rule": "default", "state_from": "last_user", "state": "j=0.95 k=chat d=0", "images": 0},
        {
            "policy": "auto",
            "state_from": "conversation",
            "state": "user: hi\n\nassistant: yes\n\nuser: j=0.1 k=code d=2",
        },
        {"policy": "auto", "state_from": "json", "state": [{"role": "user", "content": "j=0.1 k=chat d=0"}]},
        {"policy": "auto", "state_from": "last_user", "state_omitted": "over decision_log.max_state_chars (10)"},
        {"policy": "auto", "rule": "default", "state_from": None},
        {"policy": "auto", "state_from": "conversation", "state": "er: cut\n\nuser: j=0.1 k=chat d=0"},
        {"policy": "auto", "state_from": "last_user", "state": "j=0.1 k=chat d=0", "images": 2},
    ]
    config_file, traffic = files(tmp_path, traffic=[json.dumps(line) for line in lines])
    config = load_config(config_file)
    parsed, bad = read_traffic(traffic, config)
    assert [(b.line, b.error) for b in bad] == [
        (4, "the state was not logged (over decision_log.max_state_chars (10))"),
        (5, "the decision log line has no replayable state; log with `decision_log.states: true`"),
        (6, "the logged conversation was cut mid-turn (state.max_chars); it cannot be rebuilt"),
    ]
    engine = FakeEngine(answers_from_text)
    outcomes = asyncio.run(replay(config, parsed, engine=engine))
    assert [o.rule for o in outcomes] == ["refuse-jailbreak", "hard", "default", "default"]
    assert summarize(config, outcomes)["media_missing"] == 1
    # last_user: the engine reads the logged text itself
    assert "j=0.95 k=chat d=0" in [call[0] for call in engine.calls]


def test_conversation_state_is_rebuilt_exactly(tmp_path: Path) -> None:
    """A conversation policy's logged state, replayed, reaches the engine byte for byte."""
    conversation = CONFIG.replace("  auto:\n", "  auto:\n    state: {from: conversation}\n")
    state = "system: be brief\n\nuser: hi\n\nthere\n\nassistant: yes\n\nuser: j=0.1 k=code d=2"
    config_file, traffic = files(
        tmp_path, conversation, [json.dumps({"policy": "auto", "state_from": "conversation", "state": state})]
    )
    config = load_config(config_file)
    engine = FakeEngine(answers_from_text)
    asyncio.run(replay(config, read_traffic(traffic, config)[0], engine=engine))
    assert engine.calls[0][0] == state


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("[1, 2]", "expected a JSON object, found list"),
        (
            '{"hello": 1}',
            "expected a request body (with `messages`, `prompt` or `input`), {request, expect}, or a decision log line",
        ),
        ('{"request": [], "expect": {"rule": "x"}}', "`request` must be a request body"),
        ('{"request": {"model": "auto", "messages": []}, "extra": 1}', "unknown key 'extra'"),
        (
            '{"request": {"model": "auto", "messages": []}}',
            "the request is not a valid chat request: `messages` is empty",
        ),
        (labelled("x", rule="hard", route="large"), "`expect` must hold one of"),
        (labelled("x", block=False), "`expect` has 'block': False; expected"),
        (labelled("x", route="medium"), "the label names upstream 'medium', which the configuration lacks"),
    ],
)
def test_malformed_lines(tmp_path: Path, line: str, error: str) -> None:
    config_file, traffic = files(tmp_path, traffic=[line])
    lines, bad = read_traffic(traffic, load_config(config_file))
    assert lines == [] and len(bad) == 1 and bad[0].line == 1
    assert bad[0].error.startswith(error)


# --- the command ----------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    engine = FakeEngine(answers_from_text)

    async def opened(config: Config) -> FakeEngine:
        return engine

    monkeypatch.setattr(_replaycmd, "_open", opened)
    return engine


def test_command_json_and_gates(tmp_path: Path, fake_engine: FakeEngine, capsys: pytest.CaptureFixture[str]) -> None:
    config_file, traffic = files(tmp_path)
    (tmp_path / "new.yaml").write_text(CONFIG.replace("jailbreak > 0.9", "jailbreak > 0.8"), encoding="utf-8")
    args = ["replay", config_file, traffic, "--against", str(tmp_path / "new.yaml"), "--json"]
    assert main([*args, "--min-accuracy", "0.7", "--max-changed", "1"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["accuracy"] == pytest.approx(0.7) and report["changed"]["count"] == 1
    assert "warning: " + traffic + ": line 12: not JSON" in captured.err
    assert main([*args, "--min-accuracy", "0.71"]) == 1
    assert "gate: accuracy 0.700 is below --min-accuracy 0.71" in capsys.readouterr().err
    assert main([*args, "--max-changed", "0"]) == 1
    assert "gate: 1 decisions changed, over --max-changed 0" in capsys.readouterr().err


def test_command_markdown_is_the_default(
    tmp_path: Path, fake_engine: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file, traffic = files(tmp_path)
    assert main(["replay", config_file, traffic, "--concurrency", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# Replay of {config_file}\n")
    assert "| hard | 4 |" in out


def test_command_strict_stops_at_a_bad_line(
    tmp_path: Path, fake_engine: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file, traffic = files(tmp_path)
    assert main(["replay", config_file, traffic, "--strict"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {traffic}: line 12: not JSON (Expecting property name enclosed in double quotes at column 2)\n"
    )
    assert fake_engine.calls == []


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--policy", "nope"], "error: --policy 'nope' names no policy of "),
        (["--concurrency", "0"], None),
    ],
)
def test_command_bad_arguments(tmp_path: Path, fake_engine: FakeEngine, capsys: pytest.CaptureFixture[str],
                               argv: list[str], error: str | None) -> None:  # fmt: skip
    config_file, traffic = files(tmp_path)
    if error is None:
        with pytest.raises(SystemExit) as exit_info:
            main(["replay", config_file, traffic, *argv])
        assert exit_info.value.code == 2
        assert "expected a positive number, found 0" in capsys.readouterr().err
        return
    assert main(["replay", config_file, traffic, *argv]) == 2
    assert capsys.readouterr().err.startswith(error)


def test_command_missing_traffic_file(
    tmp_path: Path, fake_engine: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file, _ = files(tmp_path)
    assert main(["replay", config_file, str(tmp_path / "missing.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read the traffic file ")


def test_policy_flag_decides_lines_of_other_models(
    tmp_path: Path, fake_engine: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file, traffic = files(tmp_path)
    assert main(["replay", config_file, traffic, "--policy", "auto", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["no_policy"] == [] and report["decided"] == 12
