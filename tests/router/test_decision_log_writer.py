"""The decision log off the request path: a full disk fails no request, a full queue drops and counts, every queued
line is written on close, SIGHUP's reopen follows log rotation, the middleware writes it too."""

from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from d3backend import FakeEngine
from policies import parse_config
from router import D3RouterMiddleware, create_app
from router._observe.decisionlog import DecisionLog
from router._observe.metrics import Metrics

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{decision_log: {{path: '{log}'}}}}
upstreams: {{small: {{url: http://small.test/v1}}}}
policies:
  auto:
    questions: {{jailbreak: {{type: noul}}}}
    rules: [{{name: default, route: small}}]
"""
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


def engine() -> FakeEngine:
    return FakeEngine(lambda state, questions: {"jailbreak": 0.1})


def dropped(metrics: Metrics, reason: str) -> float:
    for line in metrics.render().splitlines():
        if line.startswith(f'd3router_decision_log_dropped_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_a_full_disk_fails_no_request(caplog: pytest.LogCaptureFixture) -> None:
    """Before: the log's write and flush ran inside the request, and /dev/full made every decided request a 500."""
    app = create_app(parse_config(CONFIG.format(log="/dev/full"), "c.yaml"), engine=engine(),
                     transport=httpx.AsyncHTTPTransport())  # fmt: skip
    with respx.mock() as mock, caplog.at_level(logging.WARNING, logger="router"):
        mock.post("http://small.test/v1/chat/completions").respond(200, json={"ok": True})
        await app.startup()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            statuses = [(await client.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(3)]
        await app.aclose()  # the writer has tried every line
    assert statuses == [200, 200, 200]
    assert dropped(app.service.metrics, "error") == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "router._observe.decisionlog"]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]  # once per interval, not per line


class Blocking(io.StringIO):
    """A file whose first write waits until released: the writer thread is busy while the test fills the queue."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait(10)
        return super().write(text)

    def close(self) -> None:
        self.closed_with = self.getvalue()
        super().close()


def test_a_full_queue_drops_and_counts_and_close_writes_the_rest(tmp_path: Path) -> None:
    metrics, file = Metrics(), Blocking()
    log = DecisionLog(tmp_path / "d.jsonl", file, metrics, max_queued=2)
    log.write("1\n")
    assert file.entered.wait(10)  # the writer holds line 1
    for line in ("2\n", "3\n", "4\n", "5\n"):
        log.write(line)  # 2 and 3 wait in the queue; 4 and 5 find it full
    assert dropped(metrics, "full") == 2
    file.release.set()
    log.close()
    assert file.closed_with == "1\n2\n3\n"
    log.write("6\n")  # after close: dropped, not raised
    assert dropped(metrics, "full") == 3


def test_every_queued_line_is_written_on_close(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "d.jsonl"
    log = DecisionLog.open(path, Metrics())
    for index in range(2000):
        log.write(json.dumps({"n": index}) + "\n")
    log.close()
    log.close()  # idempotent
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == list(range(2000))


def test_reopen_follows_log_rotation(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    log = DecisionLog.open(path, Metrics())
    log.write("before\n")
    path.rename(tmp_path / "d.jsonl.1")  # logrotate moves the file, then sends SIGHUP
    log.reopen()
    log.write("after\n")
    log.close()
    assert (tmp_path / "d.jsonl.1").read_text() == "before\n"
    assert path.read_text() == "after\n"


async def test_sighup_reopens_the_proxys_decision_log_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(log="d.jsonl"), encoding="utf-8")
    from policies import load_config

    app = create_app(load_config(path), engine=engine(), transport=httpx.AsyncHTTPTransport())
    await app.startup()
    log = app.service.decision_log
    assert isinstance(log, DecisionLog)
    reopened = threading.Event()
    original = log.reopen

    def reopen() -> None:
        original()
        reopened.set()

    log.reopen = reopen  # type: ignore[method-assign]
    path.write_text(CONFIG.format(log="d.jsonl").replace("name: default", "name: renamed"), encoding="utf-8")
    app.hangup()
    (task,) = app._retiring
    done = await task
    assert reopened.is_set() and done.ok
    assert app.config.policies["auto"].rules[0].name == "renamed"
    await app.aclose()


async def test_the_middleware_writes_the_decision_log(tmp_path: Path) -> None:
    """Before: the middleware decided without ever opening `server.decision_log`."""
    path = tmp_path / "d.jsonl"

    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"rule": request.state.d3.decision.rule})

    inner = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app: Any = D3RouterMiddleware(inner, config=parse_config(CONFIG.format(log=path), "c.yaml"), engine=engine())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        response = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "r-1"})
    assert response.json() == {"rule": "default"}
    log = app.service.decision_log
    assert isinstance(log, DecisionLog)
    log.close()
    (entry,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (entry["policy"], entry["rule"]) == ("auto", "default")


def test_flush_waits_for_the_lines_queued_before_it(tmp_path: Path) -> None:
    file = Blocking()
    log = DecisionLog(tmp_path / "d.jsonl", file, Metrics())
    log.write("1\n")
    assert file.entered.wait(10)
    assert log.flush(timeout_s=0.05) is False  # the writer still holds line 1
    file.release.set()
    assert log.flush() is True and file.getvalue() == "1\n"
    log.close()
