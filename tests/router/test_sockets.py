"""Over real sockets: streamed chunks arrive as the upstream sends them, and a client that disconnects closes the
upstream request."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from d3backend import FakeEngine, free_port
from policies import parse_config
from router import create_app
from router._asgi.messages import read_body

CHUNKS = 5
WAIT_S = 10.0  # how long anything here waits for an event that takes milliseconds: a loaded machine is no failure


class SlowStreamingUpstream:
    """An OpenAI-like upstream that streams CHUNKS SSE events, each only once the client has acknowledged the one
    before it (`received`), and notes when its client goes away. A proxy that buffered would stall it."""

    def __init__(self) -> None:
        self.disconnected = threading.Event()
        self.started = threading.Event()
        self.received = [threading.Event() for _ in range(CHUNKS)]
        self.stalled: list[int] = []  # chunks the client had not got WAIT_S after they were sent
        self.sent = 0

    async def _wait_for(self, event: threading.Event) -> bool:
        """Until `event` or the client's disconnect (polled: these are thread events), or WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while not (event.is_set() or self.disconnected.is_set()) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return event.is_set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive, 1 << 20)
        self.started.set()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()

        watcher = asyncio.create_task(watch())
        if b"think long" in body:  # a non-streamed answer that takes its time before any header
            await self._wait_for(self.disconnected)
            watcher.cancel()
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        try:
            for index in range(CHUNKS):
                if self.disconnected.is_set():
                    return
                event = {
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": f"t{index}"}}],
                }
                await send(
                    {"type": "http.response.body", "body": f"data: {json.dumps(event)}\n\n".encode(), "more_body": True}
                )
                self.sent += 1
                if not await self._wait_for(self.received[index]) and not self.disconnected.is_set():
                    self.stalled.append(index)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        finally:
            watcher.cancel()


class Served:
    """An ASGI app under uvicorn in a thread, on a free loopback port. On exit, requests still running after
    `GRACE_S` (an upstream told to hang) are cancelled, so the server and its thread are gone when its test ends."""

    GRACE_S = 2.0

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on", timeout_graceful_shutdown=self.GRACE_S))  # fmt: skip
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if self.thread.is_alive():
            raise RuntimeError(f"the test server on port {self.port} did not stop within 10 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def stack() -> Iterator[tuple[Served, SlowStreamingUpstream]]:
    upstream = SlowStreamingUpstream()
    with Served(upstream) as served_upstream:
        # expose_decisions: the test reads x-d3-rule, a debug header (closed by default, issue 25.4).
        config = parse_config(f"""
server: {{expose_decisions: true}}
upstreams: {{chat: {{url: "{served_upstream.url}/v1"}}}}
policies:
  auto:
    questions: {{j: {{type: noul}}}}
    rules:
      - {{name: guard, when: j > 0.9, block: {{status: 403, message: no}}}}
      - {{name: default, route: chat}}
""")
        with Served(create_app(config, engine=FakeEngine({"j": 0.1}))) as proxy:
            yield proxy, upstream


def test_streamed_chunks_arrive_one_by_one(stack: tuple[Served, SlowStreamingUpstream]) -> None:
    proxy, upstream = stack
    events: list[str] = []
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with (
        httpx.Client(timeout=3 * WAIT_S) as client,
        client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["x-d3-rule"] == "default"
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                if line != "data: [DONE]":
                    upstream.received[len(events) - 1].set()  # now the upstream may send the next one
    assert len(events) == CHUNKS + 1
    assert [json.loads(line[6:])["choices"][0]["delta"]["content"] for line in events[:-1]] == [
        f"t{index}" for index in range(CHUNKS)
    ]
    # Each chunk reached the client before the upstream sent the next: a buffering proxy would stall every one.
    assert upstream.stalled == []


def test_client_disconnect_closes_the_upstream_request(stack: tuple[Served, SlowStreamingUpstream]) -> None:
    proxy, upstream = stack
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with (
        httpx.Client(timeout=WAIT_S) as client,
        client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as response,
    ):
        next(response.iter_lines())  # the first event has arrived; now walk away without acknowledging it
    # The upstream waits for an acknowledgement that never comes: only the closed request ends its wait early.
    assert upstream.disconnected.wait(WAIT_S), "the upstream request was still open after the client left"
    assert upstream.sent < CHUNKS


def test_blocked_stream_gets_an_error_before_any_stream(stack: tuple[Served, SlowStreamingUpstream]) -> None:
    proxy, upstream = stack
    proxy_app = proxy.server.config.app
    proxy_app.service.engine.answers = {"j": 0.99}
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/json"
    assert not upstream.started.is_set()


def test_client_disconnect_before_the_answer_closes_the_upstream_request(
    stack: tuple[Served, SlowStreamingUpstream],
) -> None:
    proxy, upstream = stack
    body = {"model": "auto", "messages": [{"role": "user", "content": "think long"}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    assert upstream.started.is_set()
    assert upstream.disconnected.wait(WAIT_S), "the upstream was still generating after the client left"
