"""Defects found by trying the router from outside (issues 11 and 19), each pinned over real sockets or processes:
no path out of /v1, paths forwarded as written, upstream bodies cut mid-way, a reload while a request is being
decided, and quiet pipes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from starlette.types import Receive, Scope, Send

from d3backend import Decided, FakeEngine, free_port
from policies import load_config, parse_config
from router import create_app
from router._asgi.messages import read_body
from tests.router._peers import wait_serving
from tests.router.test_sockets import Served

REPO = Path(__file__).resolve().parents[2]


class Recorder:
    """An upstream that records the raw path of every request and answers 200."""

    def __init__(self) -> None:
        self.paths: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive, 1 << 20)
        self.paths.append(scope["raw_path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture(scope="module")
def served_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Recorder]]:
    """`d3router serve` as a user runs it, passing every /v1 path through to a recording upstream."""
    recorder = Recorder()
    with Served(recorder) as upstream:
        config = tmp_path_factory.mktemp("hardening") / "router.yaml"
        config.write_text(f'server: {{passthrough: ["/v1/*"]}}\nupstreams: {{up: {{url: "{upstream.url}/v1"}}}}\n'
                          "policies: {auto: {rules: [{name: default, route: up}]}}\n", encoding="utf-8")  # fmt: skip
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)  # fmt: skip
        try:
            assert wait_serving(f"http://127.0.0.1:{port}", process, 60), "d3router serve did not start"
            yield f"127.0.0.1:{port}", recorder
        finally:
            process.terminate()
            process.wait(20)


def raw_get(address: str, target: str) -> int:
    """Send `GET target` exactly as written (no client normalizes it) and return the status."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n".encode("latin-1"))
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ")[1])


@pytest.mark.parametrize(
    "target",
    ["/v1/../admin/keys", "/v1/../../admin/keys", "/v1/models/../../admin", "/v1/%2e%2e/admin/keys",
     "/v1/..%2fadmin/keys", "/v1/%2E%2E/%2E%2E/admin/keys", "/v1/files/./x", "/v1/a%5c..%5cadmin",
     "/v1/files/%00", "/v1/files/%0A", "/v1/files/%0D%0Ax:y", "/v1/files/%7F"],
)  # fmt: skip
def test_no_path_out_of_v1_and_no_control_characters(served_router: tuple[str, Recorder], target: str) -> None:
    address, recorder = served_router
    before = len(recorder.paths)
    assert raw_get(address, target) == 400
    assert len(recorder.paths) == before  # nothing was sent upstream


def test_a_path_is_forwarded_as_the_client_wrote_it(served_router: tuple[str, Recorder]) -> None:
    address, recorder = served_router
    assert raw_get(address, "/v1/files/a%3Fb/content?x=1") == 200
    assert recorder.paths[-1] == b"/v1/files/a%3Fb/content"  # %3F stays a character of the path, not a query


class Cut:
    """An upstream that promises a body and closes the connection half-way through it."""

    def __init__(self, content_type: bytes = b"application/json") -> None:
        self.content_type = content_type

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive, 1 << 20)
        headers = [(b"content-type", self.content_type)]
        if self.content_type == b"application/json":
            headers.append((b"content-length", b"1000"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"object": "chat.comp', "more_body": True})
        raise RuntimeError("the upstream dies mid-body")  # uvicorn drops the connection


CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def test_a_non_streamed_body_cut_mid_way_goes_to_the_next_upstream_or_is_a_502(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with Served(Cut()) as cut, Served(Recorder()) as good:
        # expose_decisions: x-d3-upstream says which upstream answered (a debug header, closed by default: 25.4).
        config = parse_config(f"""
server: {{expose_decisions: true}}
upstreams: {{cut: {{url: "{cut.url}/v1"}}, good: {{url: "{good.url}/v1"}}}}
policies:
  auto: {{rules: [{{name: default, route: [cut, good]}}]}}
  only: {{rules: [{{name: default, route: cut}}]}}
""")
        with Served(create_app(config)) as proxy:
            routed = httpx.post(f"{proxy.url}/v1/chat/completions", json=CHAT, timeout=10)
            assert routed.status_code == 200 and routed.headers["x-d3-upstream"] == "good"
            for api, path in (("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")):
                payload = {**CHAT, "model": "only", "max_tokens": 5}
                failed = httpx.post(f"{proxy.url}{path}", json=payload, timeout=10)
                assert failed.status_code == 502
                assert failed.headers["x-d3-upstream"] == "cut"  # the router's own 502 says which upstream
                assert failed.headers["x-d3-rule"] == "default"
                error = failed.json()["error"]
                assert error["message"] == "upstream 'cut' broke off its response: RemoteProtocolError"
                assert failed.json().get("type") == ("error" if api == "anthropic" else None)
            metrics = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    assert 'd3router_requests_total{action="route",policy="only",rule="default",status="502"} 2.0' in metrics
    assert not any(record.exc_info for record in caplog.records)


# Per client API: its path, and how its stream's error event begins.
ENDINGS = {
    "/v1/chat/completions": b'data: {"error": {"message": "upstream \'cut\' broke off its answer"',
    "/v1/completions": b'data: {"error": {"message": "upstream \'cut\' broke off its answer"',
    "/v1/responses": b'event: error\ndata: {"type": "error", "code": "upstream_error"',
    "/v1/messages": b'event: error\ndata: {"type": "error", "error": {"type": "api_error"',
}


@pytest.mark.parametrize("path", list(ENDINGS))
def test_a_stream_cut_mid_way_ends_with_the_apis_error_event_and_one_warning(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The cut falls inside an event: that event is closed, then the client API's own error event ends a whole
    response (issue 24: faults under load), with one warning and no traceback."""
    body = {"model": "auto", "stream": True, "max_tokens": 5, "prompt": "hi", "input": "hi", **CHAT}
    with Served(Cut(b"text/event-stream")) as cut:
        config = parse_config(f'upstreams: {{cut: {{url: "{cut.url}/v1"}}}}\n'
                              "policies: {auto: {rules: [{name: default, route: cut}]}}\n")  # fmt: skip
        with Served(create_app(config)) as proxy, caplog.at_level(logging.WARNING):
            answer = httpx.post(f"{proxy.url}{path}", json=body, timeout=10)  # whole: no RemoteProtocolError
    assert answer.status_code == 200
    assert answer.content.startswith(b'{"object": "chat.comp\n\n' + ENDINGS[path])
    assert answer.content.endswith(b"}\n\n")
    json.loads(answer.content.rsplit(b"data: ", 1)[1])
    ours = [r for r in caplog.records if r.name.startswith("router")]
    assert [r.getMessage() for r in ours] == [
        "upstream 'cut' broke off its response mid-way (RemoteProtocolError); the client's response ends there"
    ]
    assert not any(record.exc_info for record in caplog.records)
    assert not any("Exception in ASGI application" in record.getMessage() for record in caplog.records)


class Gate:
    """An engine that answers only when the test lets it."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        self.inner = FakeEngine({"j": 0.1})

    async def decide(self, state: Any, questions: Any, **kwargs: Any) -> Decided:
        self.called.set()
        await self.release.wait()
        return await self.inner.decide(state, questions, **kwargs)

    async def aclose(self) -> None:
        pass


@pytest.mark.anyio
async def test_a_reload_while_deciding_serves_the_request_under_one_config(tmp_path: Path) -> None:
    # expose_decisions: x-d3-upstream says which configuration routed it (a debug header, closed by default: 25.4).
    text = """
server: {{expose_decisions: true}}
upstreams: {{{name}: {{url: "http://{name}.test/v1"}}}}
policies:
  auto:
    questions: {{j: {{type: noul}}}}
    rules: [{{name: guard, when: j > 0.9, block: {{}}}}, {{name: default, route: {name}}}]
"""
    path = tmp_path / "router.yaml"
    path.write_text(text.format(name="old"), encoding="utf-8")
    gate = Gate()
    app = create_app(load_config(path), engine=gate, transport=httpx.AsyncHTTPTransport())  # type: ignore[arg-type]
    with respx.mock() as mock:
        mock.post("http://old.test/v1/chat/completions").respond(200, json={"from": "old"})
        async with app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            pending = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
            await gate.called.wait()
            path.write_text(text.format(name="new"), encoding="utf-8")  # the upstream renamed meanwhile
            assert app.reload()[0]
            gate.release.set()
            response = await pending
    assert response.status_code == 200
    assert response.json() == {"from": "old"} and response.headers["x-d3-upstream"] == "old"
    assert list(app.config.upstreams) == ["new"]


def test_reload_warns_of_engine_changes_and_applies_a_new_decision_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = 'upstreams: {up: {url: "http://up.test/v1"}}\npolicies: {auto: {rules: [{name: default, route: up}]}}\n'
    path = tmp_path / "router.yaml"
    path.write_text(base, encoding="utf-8")
    app = create_app(load_config(path), transport=httpx.AsyncHTTPTransport())
    path.write_text(base + "engine: {cache: {max_entries: 5}}\nserver: {decision_log: {path: decisions.jsonl}}\n",
                    encoding="utf-8")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="router"):
        assert app.reload()[0]
    messages = [record.getMessage() for record in caplog.records]
    assert "the engine section changed; engine changes take effect on restart" in messages
    assert app.service.decision_log is not None
    assert Path(app.service.decision_log.name) == tmp_path / "decisions.jsonl"  # beside the config, like models
    asyncio.run(app.aclose())


@pytest.mark.parametrize("command", [["schema"], ["check", "examples/routing.yaml"]])
def test_a_reader_that_leaves_early_gets_no_traceback(command: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write is a broken pipe
    try:
        result = subprocess.run([sys.executable, "-m", "router", *command], stdout=write, stderr=subprocess.PIPE,
                                cwd=REPO, timeout=60)  # fmt: skip
    finally:
        os.close(write)
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    assert b"BrokenPipeError" not in result.stderr


def test_explain_on_the_command_line(tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "auto", "input": "hi"}), encoding="utf-8")
    config = tmp_path / "router.yaml"
    config.write_text('upstreams: {up: {url: "http://up.test/v1"}}\n'
                      "policies: {auto: {rules: [{name: default, route: up}]}}\n", encoding="utf-8")  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "router", "explain", str(config), str(body)], cwd=REPO,
                            capture_output=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    explained = json.loads(result.stdout)
    assert (explained["api"], explained["state"], explained["decision"]["rule"]) == ("responses", "hi", "default")


class Hold:
    """An upstream that holds each request until the test releases it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive, 1 << 20)
        self.entered.set()
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


def test_each_upstream_has_its_own_pool_and_a_full_one_is_a_quick_503() -> None:
    hold = Hold()
    with Served(hold) as slow, Served(Recorder()) as fast:
        # expose_decisions: x-d3-upstream names the full pool's upstream (a debug header, closed by default: 25.4).
        config = parse_config(f"""
server: {{expose_decisions: true}}
upstreams:
  slow: {{url: "{slow.url}/v1", max_connections: 1, pool_timeout_s: 0.2}}
  fast: {{url: "{fast.url}/v1", max_connections: 1}}
policies:
  s: {{rules: [{{name: default, route: slow}}]}}
  f: {{rules: [{{name: default, route: fast}}]}}
""")
        with Served(create_app(config)) as proxy, ThreadPoolExecutor(1) as pool:
            url = f"{proxy.url}/v1/chat/completions"
            first = pool.submit(httpx.post, url, json={**CHAT, "model": "s"}, timeout=30)
            try:
                assert hold.entered.wait(10)
                full = httpx.post(url, json={**CHAT, "model": "s"}, timeout=30)
                other = httpx.post(url, json={**CHAT, "model": "f"}, timeout=30)
            finally:
                hold.release.set()
            assert first.result().status_code == 200
    assert full.status_code == 503
    assert full.headers["retry-after"] == "1" and full.headers["x-d3-upstream"] == "slow"
    assert "upstreams.slow.max_connections" in full.json()["error"]["message"]
    assert other.status_code == 200  # the other upstream's pool is its own
