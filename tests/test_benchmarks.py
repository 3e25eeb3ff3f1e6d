"""Quick runs of the benchmark harness so it does not rot; CI times nothing."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from benchmarks import _harness
from benchmarks._answers import ANSWERS
from benchmarks._streamrows import timing
from d3backend import free_port
from tests.conftest import require_vllm

REPO = Path(__file__).resolve().parents[1]


def run(module: str, results: Path, *extra: str) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--results", str(results), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    name = module.rsplit(".", 1)[1]
    assert (results / f"{name}.md").read_text().startswith("| ")
    payload: dict[str, object] = json.loads((results / f"{name}.json").read_text())
    return payload


def test_decisions_benchmark_runs(tmp_path: Path) -> None:
    payload = run("benchmarks.decisions", tmp_path)
    rows = payload["rows"]
    assert [row["target"] for row in rows] == [  # type: ignore[index,union-attr]
        "Decisions engine, direct",
        "Decisions engine via the router's /v1/decisions (cache off)",
        "/v1/decisions, cache hit",
        "/v1/decisions, engine call (a table engine, cache off)",
        "a pool, the Decisions engine first, via /v1/decisions (cache off)",
        "a pool, behind a first engine down (set aside), via /v1/decisions (cache off)",
        "a pool, behind a first engine failing every call (set_aside_s 0), via /v1/decisions (cache off)",
        "a pool asked for one engine's model, via /v1/decisions (cache off)",
    ]


def test_policy_benchmark_runs(tmp_path: Path) -> None:
    payload = run("benchmarks.policy", tmp_path)
    assert [row["measure"] for row in payload["rows"]] == [  # type: ignore[index,union-attr]
        "evaluate a 20-rule policy (all rules tried)",
        "load a 64-question, 100-rule file",
    ]


@pytest.mark.engine
def test_engine_benchmark_runs(tmp_path: Path) -> None:
    require_vllm()
    payload = run("benchmarks.engine", tmp_path)
    clients = [row["client"] for row in payload["rows"]]  # type: ignore[index,union-attr]
    pair = ["raw httpx", "raw httpx, aiohttp pool", "RemoteEngine"]
    assert clients == [*pair, *pair, "CachedEngine hit"]


def test_router_benchmark_runs(tmp_path: Path) -> None:
    payload = run("benchmarks.router", tmp_path, "--no-engine")
    rows = payload["rows"]
    assert {row["target"] for row in rows} >= {"direct", "pass-through, httpx pool", "d3router cache hit"}  # type: ignore[union-attr,index]
    assert all(row["errors"] == 0 for row in rows)  # type: ignore[union-attr,index]
    for name in ("responses cache hit", "messages cache hit", "stream, responses cache hit",
                 "stream, messages cache hit"):  # fmt: skip
        ratios = [row["rps vs chat"] for row in rows if row["target"] == name]  # type: ignore[union-attr,index]
        assert len(ratios) == 2 and all(ratio > 0 for ratio in ratios), name  # c=1 and 8, each set against chat
    for name in ("model rewritten, responses cache hit", "model rewritten, messages cache hit",
                 "stream, model rewritten, responses cache hit", "stream, model rewritten, messages cache hit"):  # fmt: skip
        ratios = [row["rps vs not rewritten"] for row in rows if row["target"] == name]  # type: ignore[union-attr,index]
        assert len(ratios) == 2 and all(ratio > 0 for ratio in ratios), name  # each set against its row unrewritten
    for name in ("answer guard, d3router cache hit", "stream, answer guard, d3router cache hit"):
        ratios = [row["rps vs unguarded"] for row in rows if row["target"] == name]  # type: ignore[union-attr,index]
        assert len(ratios) == 2 and all(ratio > 0 for ratio in ratios), name  # each set against its row unguarded
    extra = json.loads((tmp_path / "router-extra.json").read_text())
    # A policy that reads only facts decides every request without its engine (issue 29), which would take 10 ms.
    facts = [row for row in rows if row["target"] == "d3router facts-only policy (no engine)"]  # type: ignore[union-attr,index]
    assert len(facts) == 2 and all(row["errors"] == 0 for row in facts)  # type: ignore[index]
    calls = extra["engine_calls"]["d3router facts-only policy (no engine)"]
    assert calls["engine_calls"] == 0 and calls["decided_requests"] > 0
    streaming = extra["streaming"]
    assert {name: streaming[name]["errors"] for name in ("direct", "d3router", "pass-through")} == {
        "direct": 0,
        "d3router": 0,
        "pass-through": 0,
    }  # the first byte through the router is set beside the bare pass-through's, on the same slow upstream
    assert streaming["ttfb added p50 ms"] == streaming["d3router"]["ttfb added p50 ms"]
    assert "ttfb added p50 ms" in streaming["pass-through"]
    calls = extra["engine_calls"]["d3router fake engine 10 ms"]
    assert calls["engine_calls"] == calls["decided_requests"] > 0  # one engine call per uncached request
    assert set(extra["vs chat"]) == {"responses cache hit", "messages cache hit", "stream, responses cache hit",
                                     "stream, messages cache hit"}  # fmt: skip
    assert "- responses cache hit vs chat at c=1/8" in (tmp_path / "router.md").read_text()


def test_a_streamed_target_that_never_streamed_says_what_it_got() -> None:
    """A stream target whose every request failed (no chunk, so no gap) is reported with what the load generator saw,
    not lost in a `statistics.median([])` crash that hides it (the stop-15 CI run)."""
    failed = timing({"ttfb_ms": [1.5, 2.5], "gaps_ms": [], "errors": [502, 502]})
    assert failed["errors"] == 2 and failed["error statuses"] == {"502": 2} and failed["ttfb p50 ms"] == 2.0
    assert all(failed[key] != failed[key] for key in ("chunk gap p50 ms", "chunk gap min ms"))  # NaN: none measured
    refused = timing({"ttfb_ms": [], "gaps_ms": [], "errors": [1]})
    assert refused["ttfb p50 ms"] != refused["ttfb p50 ms"] and refused["error statuses"] == {"1": 1}
    fine = timing({"ttfb_ms": [3.0], "gaps_ms": [20.0, 21.0, 19.0], "errors": []})
    assert (fine["chunk gap p50 ms"], fine["chunk gap min ms"], fine["error statuses"]) == (20.0, 19.0, {})


def test_a_process_that_died_is_not_ready_because_something_else_answers_its_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A benchmark process that exits (its port taken) while another server answers that port is an error, not a
    target silently measured on the other server."""
    started: list[subprocess.Popen[str]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[str]:
        started.append(popen(*args, **kwargs))
        return started[-1]

    class Other(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # answers once the process has exited
            started[0].wait(10)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setattr(_harness.subprocess, "Popen", recorded)
    with http.server.HTTPServer(("127.0.0.1", 0), Other) as other:
        thread = threading.Thread(target=other.handle_request)
        thread.start()
        try:
            with pytest.raises(RuntimeError, match="exited with 3; something else answers"), _harness.process(
                [sys.executable, "-c", "raise SystemExit(3)"], f"http://127.0.0.1:{other.server_port}/"
            ):  # fmt: skip
                pass
        finally:
            thread.join(10)


def test_router_benchmark_only_picks_an_api_with_chat_to_compare(tmp_path: Path) -> None:
    payload = run("benchmarks.router", tmp_path, "--no-engine", "--only", "messages")
    targets = {row["target"] for row in payload["rows"]}  # type: ignore[union-attr,index]
    assert targets == {"direct", "d3router cache hit", "messages cache hit", "stream, direct",
                       "stream, d3router cache hit", "stream, messages cache hit", "model rewritten, messages cache hit",
                       "stream, model rewritten, messages cache hit"}  # fmt: skip


def test_soak_small(tmp_path: Path) -> None:
    """The soak at 2,000 requests: zero errors and no sockets left open (memory growth is judged on full runs)."""
    completed = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--quick", "--results", str(tmp_path)],
                               cwd=REPO, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "| 2000 |" in completed.stdout
    assert "| 2000 |" in (tmp_path / "soak.md").read_text()  # the figures went to this test's own folder


@pytest.fixture
def canned_upstream() -> Iterator[str]:
    """benchmarks._upstream on a free port, until the test ends."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks._upstream", str(port)], cwd=REPO)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.post(f"{url}/chat/completions", content=b"{}", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "the canned upstream did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_canned_upstream_speaks_each_api_as_its_sdk_reads_it(canned_upstream: str) -> None:
    """The official SDKs read the canned Responses and Messages answers, plain and streamed, into typed objects:
    the benchmark's upstream answers in the shapes and event formats a real one does."""
    with (
        openai.OpenAI(base_url=canned_upstream, api_key="x", max_retries=0) as openai_client,
        anthropic.Anthropic(
            base_url=canned_upstream.removesuffix("/v1"), api_key="x", max_retries=0
        ) as anthropic_client,
    ):
        check_sdks_read(openai_client, anthropic_client)


def check_sdks_read(openai_client: openai.OpenAI, anthropic_client: anthropic.Anthropic) -> None:
    response = openai_client.responses.create(model="m", input="hi")
    assert (response.status, response.output_text) == ("completed", "ok")
    events = list(openai_client.responses.create(model="m", input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds.count("response.output_text.delta") == 5 and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "t0t1t2t3t4"  # type: ignore[union-attr]

    message = anthropic_client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert (message.stop_reason, message.content[0].text) == ("end_turn", "ok")  # type: ignore[union-attr]
    with anthropic_client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
        message_kinds: list[str] = [event.type for event in s]
        final = s.get_final_message()
    assert message_kinds[:2] == ["message_start", "content_block_start"] and message_kinds[-1] == "message_stop"
    assert "content_block_stop" in message_kinds and "message_delta" in message_kinds
    assert (final.content[0].text, final.stop_reason) == ("t0t1t2t3t4", "end_turn")  # type: ignore[union-attr]


def test_every_api_streams_in_as_many_chunks_as_chat() -> None:
    """Like for like: each API's stream is relayed in as many chunks as chat's, carrying the same deltas."""
    chunks = {path: stream for path, (_, stream) in ANSWERS.items()}
    assert {len(stream) for stream in chunks.values()} == {6}
    for stream in chunks.values():
        assert [sum(b'"t%d"' % i in chunk for i in range(5)) for chunk in stream] == [1, 1, 1, 1, 1, 0]


def test_memory_benchmark_runs(tmp_path: Path) -> None:
    """`benchmarks/memory.py --quick`: both rows run and every request is answered (decided 403, or bounded 503)."""
    payload = run("benchmarks.memory", tmp_path)
    rows = payload["rows"]
    assert [row["target"] for row in rows] == ["bounded (defaults)", "unbounded (as before)"]  # type: ignore[index,union-attr]
    assert all(row["other"] == 0 and row["403 (decided)"] + row["503 (bounded)"] == row["clients"]
               for row in rows)  # type: ignore[index,union-attr]  # fmt: skip


def test_overlap_benchmark_runs(tmp_path: Path) -> None:
    """`benchmarks/overlap.py --quick` (issue 31.4): the four APIs, plain and streamed, every request answered."""
    payload = run("benchmarks.overlap", tmp_path)
    rows = payload["rows"]
    assert [(row["api"], row["stream"]) for row in rows] == [  # type: ignore[index,union-attr]
        (api, stream) for stream in (False, True) for api in ("chat", "responses", "messages", "completions")
    ]
    assert all(row["errors"] == 0 and row["requests"] == 8 for row in rows)  # type: ignore[index,union-attr]


def test_answer_stream_benchmark_runs(tmp_path: Path) -> None:
    """`benchmarks/_answerrows.py --quick` (issue 27): a 2,000-token stream through the windowed answer guard and
    without it, burst and paced, every request answered; the guard's rows judged eight windows."""
    completed = subprocess.run([sys.executable, "-m", "benchmarks._answerrows", "--quick", "--results", str(tmp_path)],
                               cwd=REPO, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads((tmp_path / "answer-stream.json").read_text())["rows"]
    assert [(row["pace"].split(",")[0], row["target"].rsplit(", ", 1)[1]) for row in rows] == [
        ("burst", "unguarded"), ("burst", "answer guard"), ("paced", "unguarded"), ("paced", "answer guard"),
    ]  # fmt: skip
    assert all(row["errors"] == 0 and row["requests"] == 2 for row in rows)
    assert [row["windows"] for row in rows] == [0, 8, 0, 8]
    assert all(row["total added ms"] > 0 for row in rows if row["windows"])  # each window is a 20 ms engine call
