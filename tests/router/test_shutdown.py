"""Graceful shutdown of a real `d3router serve` process over real sockets (issue 14): on SIGTERM `/readyz` answers
503 at once while new connections are still served for `server.drain_s`; then new connections are refused and
in-flight streams finish within `server.grace_s`; the process exits 0. A second signal forces the exit."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from d3backend import free_port
from router._asgi.messages import read_body
from tests.router.test_sockets import Served

CONFIG = """
server: {{drain_s: {drain_s}, grace_s: {grace_s}}}
upstreams: {{chat: {{url: "{upstream}/v1"}}}}
policies:
  auto: {{rules: [{{name: default, route: chat}}]}}
"""
BODY = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class HeldStream:
    """An upstream that sends one SSE event, then holds the stream open until the test calls `release()`."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive, 1 << 20)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for index in range(3):
            event = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{index}"}}]}
            await send(
                {"type": "http.response.body", "body": f"data: {json.dumps(event)}\n\n".encode(), "more_body": True}
            )
            while index == 0 and not self.released.is_set():
                await asyncio.sleep(0.02)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


class Router:
    """`d3router serve` in a child process."""

    def __init__(self, config: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(self.port)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        if not wait_for(lambda: status(f"{self.url}/healthz") == 200 or self.process.poll() is not None, 30):
            self.process.kill()
        if self.process.poll() is not None:
            pytest.fail(self.process.communicate()[0].decode())

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def close(self) -> None:
        """Kill the process if a failed test left it running, and close its pipe."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=30)

    def finish(self, timeout_s: float = 30) -> str:
        """Wait for the exit (0 expected) and return the output."""
        output = self.process.communicate(timeout=timeout_s)[0].decode()
        assert self.process.returncode == 0, output
        assert "Traceback" not in output, output
        return output


def status(url: str) -> int | None:
    """The status of a GET on a new connection, or None if the connection is refused."""
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.ConnectError:
        return None


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def upstream() -> Iterator[tuple[Served, HeldStream]]:
    held = HeldStream()
    with Served(held) as served:
        yield served, held
        held.release()


def start(tmp_path: Path, upstream: Served, *, drain_s: float, grace_s: int) -> Router:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(drain_s=drain_s, grace_s=grace_s, upstream=upstream.url), encoding="utf-8")
    router = Router(path)
    assert status(f"{router.url}/readyz") == 200
    return router


def test_a_stream_in_flight_at_sigterm_completes(tmp_path: Path, upstream: tuple[Served, HeldStream]) -> None:
    served, held = upstream
    router = start(tmp_path, served, drain_s=1.0, grace_s=30)
    try:
        with httpx.Client(timeout=30) as client, client.stream("POST", f"{router.url}/v1/chat/completions", json=BODY) as response:  # fmt: skip
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")  # the stream is in flight
            router.signal(signal.SIGTERM)
            # Drain: each probe is a new connection, still accepted and answered, and /readyz says 503.
            assert wait_for(lambda: status(f"{router.url}/readyz") == 503), "/readyz did not turn 503 on SIGTERM"
            assert status(f"{router.url}/healthz") == 200
            # After the drain the listener is closed: a new connection is refused, not reset mid-request.
            assert wait_for(lambda: status(f"{router.url}/healthz") is None), "still accepting after the drain"
            assert router.process.poll() is None, "exited with a stream in flight"
            held.release()
            rest = [line for line in lines if line.startswith("data: ")]
        assert len(rest) == 3 and rest[-1] == "data: [DONE]"  # t1, t2 and [DONE]: the stream completed
        output = router.finish()
    finally:
        router.close()
    assert "draining" in output


def test_a_stream_past_the_grace_timeout_is_cut_and_the_process_exits_0(
    tmp_path: Path, upstream: tuple[Served, HeldStream]
) -> None:
    served, _ = upstream
    router = start(tmp_path, served, drain_s=0.2, grace_s=1)
    try:
        with httpx.Client(timeout=30) as client, client.stream("POST", f"{router.url}/v1/chat/completions", json=BODY) as response:  # fmt: skip
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            router.signal(signal.SIGTERM)
            with pytest.raises(httpx.RemoteProtocolError):  # never released: cut when the grace runs out
                list(lines)
        output = router.finish()
    finally:
        router.close()
    assert "grace timeout (1 s): closing 1 connections still open" in output
    assert status(f"{router.url}/healthz") is None  # after the grace timeout: connection refused


def test_a_second_signal_forces_the_exit_during_the_drain(tmp_path: Path, upstream: tuple[Served, HeldStream]) -> None:
    served, _ = upstream
    router = start(tmp_path, served, drain_s=600, grace_s=600)
    try:
        router.signal(signal.SIGTERM)
        assert wait_for(lambda: status(f"{router.url}/readyz") == 503)
        router.signal(signal.SIGINT)
        output = router.finish(timeout_s=30)  # far below the 600 s drain
    finally:
        router.close()
    assert "second signal" in output
