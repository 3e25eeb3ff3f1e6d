"""Real peers shared by the tests that start `d3router serve` as a process: a recording upstream, the wait for the
router to serve, and starting and stopping a Python process of the tests' own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest


class _Recording(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.seen.append(dict(self.headers.items()))  # type: ignore[attr-defined]
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def recording_upstream() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An upstream on a free loopback port answering every POST with `{"ok": true}`; yields its port and the
    headers of each request it got."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port, server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def wait_serving(url: str, process: subprocess.Popen[bytes], wait_s: float = 30.0) -> bool:
    """Wait until the router at `url` answers `/healthz`; False if the process exits or `wait_s` passes first."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return True
        except httpx.HTTPError:
            time.sleep(0.1)
    return False


def wait_until_ready(url: str, process: subprocess.Popen[bytes], log: Path, wait_s: float) -> None:
    """Wait until the router at `url` answers `/readyz` with 200 (its engine can decide); fail with the end of its
    log if the process exits or `wait_s` passes first."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"d3router serve did not become ready:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.post(url, content=b"{}", timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail(f"{process.args} did not start: {process.communicate()[0]!r}")
            time.sleep(0.1)


def start(argv: list[str], ready: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, **(env or {})})  # fmt: skip
    wait_ready(ready, process)
    return process


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGINT, then the exit code (its output is printed, for a failing test's report)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        output = process.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        output = process.communicate()[0]
    print(output.decode(errors="replace"))
    return process.returncode
