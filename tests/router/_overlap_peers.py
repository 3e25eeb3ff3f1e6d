"""The peers of the overlap tests (issue 31.3): an upstream on raw sockets that records each request, when it came
and when its connection was closed, and a client on a raw socket that reads every byte the router sends."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MARK = "SPECULATED-ANSWER"  # in every answer the upstream gives: a byte of it at the client is a leak
WAIT_S = 10.0


@dataclass
class Seen:
    """One request the upstream got."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    closed_at: float | None = None  # the router closed the connection before the answer was sent
    answered: bool = False


@dataclass
class RecordingUpstream:
    """HTTP/1.1 on a raw listening socket; every answer waits `first_s` (`slow` in the prompt: `slow_s`), watching
    the connection meanwhile, then answers a JSON body with usage, or an event stream, with `MARK` in it."""

    first_s: float = 0.05
    slow_s: float = 5.0
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}/v1"

    def close(self) -> None:
        self.stopping.set()
        self.server.close()
        self.accepting.join(WAIT_S)
        for thread in self.threads:
            thread.join(WAIT_S)

    def _accept(self) -> None:
        self.server.settimeout(0.05)
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except (TimeoutError, OSError):
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while not self.stopping.is_set():
                while b"\r\n\r\n" not in buffer:
                    chunk = self._recv(conn)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    chunk = self._recv(conn)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                seen = Seen(lines[0].split(" ")[1], json.loads(body), headers, time.monotonic())
                self.seen.append(seen)
                wait_s = self.slow_s if b"slow" in body else self.first_s
                if not self._wait(conn, wait_s):
                    seen.closed_at = time.monotonic()
                    return
                conn.sendall(self._answer(seen))
                seen.answered = True

    def _recv(self, conn: socket.socket) -> bytes:
        while not self.stopping.is_set():
            ready, _, _ = select.select([conn], [], [], 0.05)
            if ready:
                try:
                    return conn.recv(65536)
                except OSError:
                    return b""
        return b""

    def _wait(self, conn: socket.socket, wait_s: float) -> bool:
        """Wait `wait_s`; False as soon as the peer closes the connection."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0 and not self.stopping.is_set():
            ready, _, _ = select.select([conn], [], [], min(left, 0.01))
            if ready and not conn.recv(1, socket.MSG_PEEK):
                return False
        return not self.stopping.is_set()

    @staticmethod
    def _answer(seen: Seen) -> bytes:
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        if seen.body.get("stream") is True:
            events = b"".join(b"data: %s\n\n" % json.dumps({"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"content": f"{MARK} {index}"}}]}).encode() for index in range(3))  # fmt: skip
            events += b"data: [DONE]\n\n"
            return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(events), events))  # fmt: skip
        body = json.dumps({"id": "a1", "object": "chat.completion", "model": "m", "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": MARK}, "finish_reason": "stop"}]}).encode()  # fmt: skip
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def raw_post(port: int, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    """Every byte the router sends for one request over a raw socket (`Connection: close`), head included."""
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               f"content-length: {len(data)}\r\nconnection: close\r\n{extra}\r\n").encode() + data  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def header_of(raw: bytes, name: str) -> str | None:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    for line in head.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None
