"""Answer guards leave what request policies leave (issue 27, item 4): a decision log line per judgement that
`d3router replay` judges again and `d3router calibrate --answer` fits thresholds on, and a `d3.answer` trace span
under the upstream attempt it judges."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from d3backend import FakeEngine
from policies import load_config, parse_config
from router import ProxyApp, create_app
from router._cli.main import main
from router._offline.replay import read_traffic, replay
from tests.router.test_answer_guard import BLOCK, CONFIG, MARKER, PATHS, WINDOWED, answer, request, verdicts

pytestmark = pytest.mark.anyio

LOGGED = "server: {{default_policy: guarded, decision_log: {{path: log.jsonl, states: true}}}}"


def config_text(states: bool = True, extra: str = WINDOWED, leak: str = BLOCK) -> str:
    text = CONFIG.format(leak=leak, extra=extra)
    if states:
        text = text.replace("server: {default_policy: guarded}", LOGGED.format())
    return text


async def logged(text: str, upstream: tuple[bytes, str], api: str = "chat", stream: bool = True
                 ) -> tuple[httpx.Response, list[dict[str, Any]]]:  # fmt: skip
    """The client's response and the decision log's lines for one request through the proxy."""
    app: ProxyApp = create_app(parse_config(text, "c.yaml"), engine=FakeEngine(verdicts),
                               transport=httpx.AsyncHTTPTransport())  # fmt: skip
    log = io.StringIO()
    app.service.decision_log = log
    body, kind = upstream
    with respx.mock(assert_all_called=True) as mock:
        mock.route(host="up.test").mock(return_value=httpx.Response(200, content=body, headers={"content-type": kind}))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            response = await http.post(PATHS[api], json=request(api, stream))
    written = log.getvalue()
    await app.aclose()
    return response, [json.loads(line) for line in written.splitlines()]


def long_stream(*texts: str) -> tuple[bytes, str]:
    events = b"".join(
        f"data: {json.dumps({'id': 'x', 'choices': [{'index': 0, 'delta': {'content': t}}]})}\n\n".encode()
        for t in texts
    )
    return events + b"data: [DONE]\n\n", "text/event-stream"


LINES = [f"line {i} of a long and harmless answer. " for i in range(8)]


async def test_each_window_of_a_stream_writes_an_answer_line() -> None:
    response, lines = await logged(config_text(), long_stream(*LINES, f"and then {MARKER} at last."))
    assert response.status_code == 200 and MARKER.encode() not in response.content
    # The request's line is written once its answer ended (its usage known): after the answer's lines.
    *answers, request_line = lines
    assert request_line["rule"] == "default" and "kind" not in request_line, "the request's line is as it was"
    assert [line["kind"] for line in answers] == ["answer"] * len(answers) and len(answers) > 2
    assert sorted(line["window"] for line in answers) == list(range(len(answers)))
    assert {line["request_id"] for line in answers} == {request_line["request_id"]}
    last = max(answers, key=lambda line: line["window"])
    assert (last["rule"], last["outcome"]) == ("no-leak", "block") and last["answers"]["leak"]["noul"] == 0.99
    assert MARKER in last["state"]["answer"] and last["state"]["request"] == "What is in the vault?"
    assert {line["outcome"] for line in answers if line is not last} == {"pass"}
    assert all(line["rule"] == "-" for line in answers if line is not last)


async def test_a_whole_answer_writes_one_line_and_no_text_without_states() -> None:
    text = config_text(extra="").replace("states: true", "states: false")
    response, (line, _) = await logged(text, answer("chat", False, "a clean answer"), stream=False)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "a clean answer"
    assert (line["kind"], line["rule"], line["outcome"], line["degraded"]) == ("answer", "-", "pass", False)
    assert "state" not in line and "window" not in line, "the answer's text is user content: only with states"


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return str(tmp_path / name)


async def test_replay_judges_logged_answers_again_and_against_a_changed_guard(tmp_path: Path) -> None:
    _, lines = await logged(config_text(), long_stream(*LINES, f"and then {MARKER} at last."))
    traffic = write(tmp_path, "traffic.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    config = load_config(write(tmp_path, "router.yaml", config_text()))
    read, bad = read_traffic(traffic, config)
    assert bad == [] and [line.answer is not None for line in read] == [True] * (len(lines) - 1) + [False]
    outcomes = await replay(config, read, engine=FakeEngine(verdicts))
    assert [(o.rule, o.action) for o in outcomes[:-1]] == [(line["rule"], line["outcome"]) for line in lines[:-1]]
    assert all(o.kind == "answer" and o.answers for o in outcomes[:-1]) and outcomes[-1].kind != "answer"


def test_the_replay_report_counts_answers_apart_and_lists_the_changed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("router._offline.commands._open", _fake_open(FakeEngine(verdicts)))
    _, lines = asyncio.run(logged(config_text(), long_stream(*LINES, f"and then {MARKER} at last.")))
    traffic = write(tmp_path, "traffic.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    write(tmp_path, "router.yaml", config_text())
    loose = write(tmp_path, "loose.yaml", config_text().replace("when: leak > 0.8", "when: leak > 0.995"))
    assert main(["replay", str(tmp_path / "router.yaml"), traffic, "--against", loose, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["decided"] == 1 and report["per_rule"] == {"default": 1}, "the request's figures are its own"
    answers = report["answers"]
    assert answers["judged"] == len(lines) - 1 and answers["per_outcome"] == {"pass": len(lines) - 2, "block": 1}
    assert report["changed"]["pairs"] == {"answer no-leak (block) -> answer - (pass)": 1}
    assert main(["replay", str(tmp_path / "router.yaml"), traffic]) == 0
    assert "## Answers: " in capsys.readouterr().out


def labelled(state: str, leak: bool) -> str:
    expect = {"rule": "no-leak"} if leak else {"rule": "-"}
    return json.dumps({"kind": "answer", "policy": "guarded", "state": {"answer": state}, "expect": expect}) + "\n"


def test_calibrate_fits_an_answer_rules_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Labelled answer lines: the engine says `leak` as the text's number; the labels put the line at 0.6."""

    def by_number(state: Any, questions: Any) -> dict[str, Any]:
        value = float(state["answer"].split("=")[1])
        return {"leak": value, "destructive": 0.0}

    monkeypatch.setattr("router._offline.commands._open", _fake_open(FakeEngine(by_number)))
    traffic = write(tmp_path, "answers.jsonl", "".join(labelled(f"p={p}", p > 0.6) for p in (0.1, 0.3, 0.5, 0.7, 0.9)))
    # PyYAML (which --write edits with) reads no `?` in a flow mapping's plain scalar
    config = write(tmp_path, "router.yaml", config_text().replace("?}", "}"))
    out = str(tmp_path / "fitted.yaml")
    code = main(["calibrate", config, traffic, "--policy", "guarded", "--answer", "--rule", "no-leak", "--json",
                 "--write", out])  # fmt: skip
    assert code == 0
    curve = json.loads(capsys.readouterr().out)
    assert curve["condition"] == "leak > 0.8" and curve["chosen"]["threshold"] == 0.6 and curve["chosen"]["f1"] == 1
    fitted = load_config(out)
    guard = fitted.policies["guarded"].answer
    assert guard is not None and guard.rules[1].when == "leak > 0.6"
    assert fitted.policies["guarded"].rules[0].name == "default", "the request rules are untouched"


def test_calibrate_answer_names_the_answer_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr("router._offline.commands._open", _fake_open(FakeEngine(verdicts)))
    traffic = write(tmp_path, "answers.jsonl", labelled("p=0.1", False))
    config = write(tmp_path, "router.yaml", config_text())
    assert main(["calibrate", config, traffic, "--policy", "guarded", "--answer", "--rule", "default"]) == 2
    assert "policy 'guarded' has no answer rule 'default'; expected one of no-destruction, no-leak" in (
        capsys.readouterr().err
    )


def test_an_answer_line_naming_an_unknown_answer_rule_is_skipped(tmp_path: Path) -> None:
    line = json.dumps({"kind": "answer", "policy": "guarded", "state": {"answer": "x"}, "expect": {"rule": "nope"}})
    config = load_config(write(tmp_path, "router.yaml", config_text()))
    missing = json.dumps({"kind": "answer", "policy": "guarded", "state_omitted": "over (10)"})
    _, bad = read_traffic(write(tmp_path, "t.jsonl", line + "\n" + missing + "\n"), config)
    assert [b.line for b in bad] == [1, 2]
    assert "answer rule 'nope'" in bad[0].error and bad[1].error == "the answer was not logged (over (10))"


def _fake_open(engine: FakeEngine) -> Any:
    async def open_engine(config: Any) -> FakeEngine:
        return engine

    return open_engine


async def test_each_judgement_is_a_span_under_the_upstream_attempt(spans: InMemorySpanExporter) -> None:
    response, _ = await logged(config_text(states=False), long_stream(*LINES, f"and then {MARKER} at last."))
    assert response.status_code == 200
    finished = {span.context.span_id: span for span in spans.get_finished_spans()}
    (attempt,) = [span for span in finished.values() if span.name == "d3.upstream"]
    judged = [span for span in finished.values() if span.name == "d3.answer"]
    assert len(judged) > 2
    assert all(span.parent is not None and span.parent.span_id == attempt.context.span_id for span in judged)
    windows = sorted(judged, key=lambda span: span.attributes["d3.answer.window"])  # type: ignore[index]
    assert [s.attributes["d3.answer.window"] for s in windows] == list(range(len(judged)))  # type: ignore[index]
    last = windows[-1].attributes or {}
    assert (last["d3.answer.rule"], last["d3.answer.outcome"], last["d3.policy"]) == ("no-leak", "block", "guarded")
    engines = [span for span in finished.values() if span.name == "d3.engine"]
    answer_ids = {span.context.span_id for span in judged}
    assert sum(1 for span in engines if span.parent is not None and span.parent.span_id in answer_ids) == len(judged)
    assert all(MARKER not in json.dumps(dict(span.attributes or {})) for span in finished.values())


async def explained(body: dict[str, Any], query: str = "") -> httpx.Response:
    text = config_text(states=False) + "  plain:\n    rules: [{name: default, route: up}]\n"
    text = text.replace("server: {default_policy: guarded}",
                                             "server: {default_policy: guarded, admin_token_env: D3_ADMIN}")  # fmt: skip
    app: ProxyApp = create_app(parse_config(text, "c.yaml"), engine=FakeEngine(verdicts),
                               transport=httpx.AsyncHTTPTransport(), environ={"D3_ADMIN": "admin"})  # fmt: skip
    with respx.mock(assert_all_mocked=True):  # no upstream is called
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router",
                                     headers={"x-d3-admin-token": "admin"}) as http:  # fmt: skip
            response = await http.post("/v1/d3/explain" + query, json=body)
    await app.aclose()
    return response


async def test_explain_judges_a_given_answer_with_the_policys_answer_guard() -> None:
    call = {"name": "shell", "arguments": '{"command": "rm -rf ~"}'}
    body = {**request("chat", False), "d3_answer": {"text": "Sure, cleaning up.", "tool_calls": [call]}}
    response = await explained(body)
    assert response.status_code == 200
    payload = response.json()
    assert payload["decision"]["rule"] == "default", "the request's own explain is as it was"
    answer = payload["answer"]
    assert answer["verdict"] == {
        "rule": "no-destruction", "outcome": "block", "status": 403, "message": "That command was refused.",
        "tags": {}, "degraded": False,
        "trace": [{"rule": "no-destruction", "when": "destructive > 0.8", "matched": True}],
    }  # fmt: skip
    (judged,) = answer["judgements"]
    assert judged["state"] == {"request": "What is in the vault?", "answer": "Sure, cleaning up.",
                               "tool_calls": [call]}  # fmt: skip
    assert judged["answers"]["destructive"]["noul"] == 0.99 and set(answer["questions"]) == {"leak", "destructive"}


@pytest.mark.parametrize(
    ("given", "query", "rule"),
    [
        (MARKER, "", "no-leak"),
        ({"body": json.loads(answer("messages", False, f"it is {MARKER}")[0])}, "?api=messages", "no-leak"),
        ({"events": answer("responses", True, f"it is {MARKER}")[0].decode()}, "?api=responses", "no-leak"),
        ({"text": "all clear"}, "", "-"),
    ],
)
async def test_explain_reads_an_answer_as_text_an_apis_body_or_a_stream(given: Any, query: str, rule: str) -> None:
    api = query.removeprefix("?api=") or "chat"
    response = await explained({**request(api, False), "d3_answer": given}, query)
    assert response.status_code == 200, response.text
    assert response.json()["answer"]["verdict"]["rule"] == rule


async def test_explain_refuses_what_is_not_an_answer() -> None:
    response = await explained({**request("chat", False), "d3_answer": {"text": 3}})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("`d3_answer` must be {")


async def test_explain_of_an_answer_needs_an_answer_guard() -> None:
    response = await explained({**request("chat", False), "model": "plain", "d3_answer": "hello"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "policy 'plain' has no answer guard to judge `d3_answer` with"


def test_the_explain_command_judges_a_given_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr("router._decision.engines.build_engine", lambda *args, **kwargs: FakeEngine(verdicts))
    config = write(tmp_path, "router.yaml", config_text(states=False))
    body = write(tmp_path, "body.json", json.dumps({**request("chat", False), "d3_answer": f"the code is {MARKER}"}))
    assert main(["explain", config, body]) == 0
    verdict = json.loads(capsys.readouterr().out)["answer"]["verdict"]
    assert (verdict["rule"], verdict["outcome"], verdict["status"]) == ("no-leak", "block", 451)
