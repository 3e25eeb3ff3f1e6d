"""Faults over real sockets: the engine down at start or dying mid-run, an engine answering garbage, an upstream
that hangs, and an upstream stream that breaks mid-way. The router keeps serving and never hangs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.types import Receive, Scope, Send

from d3backend import free_port
from policies import parse_config
from router import create_app
from router._asgi.messages import read_body
from tests.router import _peers as peers
from tests.router.test_sockets import Served

ANSWER = {"answers": {"j": {"type": "noul", "noul": 0.1, "probabilities": {"yes": 0.1, "no": 0.9}, "confidence": 0.9}}}


class Engine:
    """A /v1/systemone peer whose behaviour the test switches: ok, garbage, partial, 500, slow."""

    def __init__(self) -> None:
        self.mode = "ok"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive, 1 << 20)
        asked = json.loads(raw or b"{}").get("questions", {})
        noul = ANSWER["answers"]["j"]
        status, body = 200, json.dumps({"answers": dict.fromkeys(asked, noul)}).encode()
        if self.mode == "garbage":
            body = b"<html>not json</html>"
        elif self.mode == "partial":
            body = json.dumps({"answers": {}}).encode()
        elif self.mode == "wrong-types":
            body = json.dumps({"answers": {"j": {"type": "noul", "probabilities": {"yes": "high", "no": 0}}}}).encode()
        elif self.mode == "500":
            status, body = 500, b'{"error": {"message": "engine crashed"}}'
        elif self.mode == "slow":
            await asyncio.sleep(2)
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": body})


class Upstream:
    """A chat upstream that answers, hangs before answering, or breaks its stream after one chunk."""

    def __init__(self) -> None:
        self.mode = "ok"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive, 1 << 20)
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "break":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})
            raise RuntimeError("the upstream dies mid-stream")  # uvicorn aborts the connection
        body = b'{"object": "chat.completion", "choices": []}'
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


READYZ_S = 0.2
# expose_decisions: the tests read x-d3-degraded (a debug header, closed by default: issue 25.4). readyz_interval_s:
# /readyz answers from the last engine probe, probed at most once per interval (25.4); short, so a test sees a change.
CONFIG = """
engine: {{remote: {{urls: ["{engine}"], model: m, timeout_s: 1.0}}, cache: {{max_entries: 0}}}}
server: {{decision_timeout_s: 1.5, expose_decisions: true, readyz_interval_s: {readyz_s}}}
upstreams: {{chat: {{url: "{upstream}/v1", timeout_s: 1.0}}}}
policies:
  auto:
    questions: {{j: {{type: noul}}}}
    rules:
      - {{name: guard, when: j > 0.9, block: {{status: 403, message: no}}}}
      - {{name: default, route: chat}}
"""


@pytest.fixture
def stack() -> Iterator[tuple[Served, Engine, Upstream]]:
    engine, upstream = Engine(), Upstream()
    with Served(engine) as served_engine, Served(upstream) as served_upstream:
        config = parse_config(CONFIG.format(readyz_s=READYZ_S, upstream=served_upstream.url, engine=served_engine.url))
        with Served(create_app(config)) as proxy:  # the app owns its engine and closes it on shutdown
            yield proxy, engine, upstream


def chat(proxy: Served, stream: bool = False) -> httpx.Response:
    body = {"model": "auto", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=10)


@pytest.mark.parametrize("mode", ["garbage", "partial", "wrong-types", "500", "slow"])
def test_engine_trouble_degrades_and_recovers(stack: tuple[Served, Engine, Upstream], mode: str) -> None:
    proxy, engine, _ = stack
    engine.mode = mode
    response = chat(proxy)
    assert response.status_code == 200  # on_engine_error: the default route
    assert response.headers["x-d3-degraded"] == "engine-error"
    engine.mode = "ok"
    healthy = chat(proxy)  # one failure does not set the URL aside
    assert "x-d3-degraded" not in healthy.headers
    assert healthy.headers["x-d3-answers"] == "j=0.10"


def test_a_hanging_upstream_is_a_504_after_its_timeout(stack: tuple[Served, Engine, Upstream]) -> None:
    proxy, _, upstream = stack
    upstream.mode = "hang"
    start = time.monotonic()
    response = chat(proxy)
    assert response.status_code == 504
    assert response.json()["error"]["message"] == "upstream 'chat' did not answer within 1 s"
    assert time.monotonic() - start < 5


def test_a_broken_upstream_stream_ends_the_clients_stream_with_an_error(stack: tuple[Served, Engine, Upstream]) -> None:
    proxy, _, upstream = stack
    upstream.mode = "break"
    start = time.monotonic()
    # A whole response ending with OpenAI's mid-stream error event, which the SDK raises: not a cut connection.
    with openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0, timeout=10) as client:
        stream = client.chat.completions.create(model="auto", stream=True, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.APIError, match=r"^upstream 'chat' broke off its answer$"):
            for _ in stream:
                pass
    assert time.monotonic() - start < 5  # and it does not hang
    upstream.mode = "ok"
    assert chat(proxy).status_code == 200  # the router keeps serving


def test_engine_dies_mid_run(tmp_path: Path) -> None:
    """A real engine process killed mid-run: requests degrade at once, and the router recovers when it is back."""
    port = free_port()
    script = tmp_path / "engine.py"
    script.write_text(
        "import sys, uvicorn\nfrom tests.router.test_faults import Engine\n"
        "uvicorn.run(Engine(), host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n",
        encoding="utf-8",
    )

    repo = Path(__file__).resolve().parents[2]

    def start() -> subprocess.Popen[bytes]:
        # Bounded, and the process reaped if it does not start (a loaded machine starts Python slowly).
        return peers.start([str(script), str(port)], f"http://127.0.0.1:{port}/v1/systemone", {"PYTHONPATH": str(repo)})

    def kill(proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        proc.communicate(timeout=30)

    engine_proc = start()
    upstream = Upstream()
    try:
        with Served(upstream) as served_upstream:
            config = parse_config(
                CONFIG.format(readyz_s=READYZ_S, upstream=served_upstream.url, engine=f"http://127.0.0.1:{port}")
            )
            with Served(create_app(config)) as proxy:
                assert "x-d3-degraded" not in chat(proxy).headers
                kill(engine_proc)
                for _ in range(3):
                    response = chat(proxy)
                    assert response.status_code == 200
                    assert response.headers["x-d3-degraded"] == "engine-error"
                time.sleep(READYZ_S * 1.5)  # the last probe (before the kill) is old enough: /readyz probes again
                ready = httpx.get(f"{proxy.url}/readyz", timeout=5)
                assert ready.status_code == 503 and "engine" in ready.json()["reason"]
                engine_proc = start()
                # After three failures the URL is set aside for 2 s; then the next call tries it again.
                deadline = time.monotonic() + 30
                while httpx.get(f"{proxy.url}/readyz", timeout=5).status_code != 200:
                    assert time.monotonic() < deadline, "the router did not recover when the engine came back"
                    time.sleep(0.2)
                assert "x-d3-degraded" not in chat(proxy).headers
    finally:
        kill(engine_proc)


def test_serve_starts_with_the_engine_down(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    dead = f"http://127.0.0.1:{free_port()}"
    path.write_text(CONFIG.format(readyz_s=READYZ_S, upstream="http://127.0.0.1:9", engine=dead), encoding="utf-8")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(path), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and process.poll() is None, "serve did not start"
                time.sleep(0.2)
        assert ready.status_code == 503
        assert ready.json()["reason"] == "cannot reach the decision engine", "no engine URL to a caller"
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        routed = httpx.post(f"{url}/v1/chat/completions", timeout=10,
                            json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert routed.headers["x-d3-degraded"] == "engine-error"  # decided by on_engine_error, then 502 upstream
        assert routed.status_code == 502
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0].decode()
    assert "the decision engine is not ready" in output
    assert "Traceback" not in output
