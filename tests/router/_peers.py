"""Real peers shared by the tests that start `d3router serve` as a process: a recording upstream, and the wait for
the router to serve."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


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
