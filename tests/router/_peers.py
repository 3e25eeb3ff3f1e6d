"""Peers shared by the router's tests. Real ones, for the tests that start `d3router serve` as a process: a recording
upstream, the wait for the router to serve, `d3router serve` started until ready, and starting and stopping a Python
process of the tests' own. In process: the clients of a module's `app` fixture (an httpx client and the official
SDKs, `proxy_clients`), and a Chat Completions fake's answers (`chat_reply`), for the translation tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from d3backend import free_port
from router import ProxyApp
from tests.router import _sdk_shapes as sdk


def send_json(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """Answer `handler`'s request 200 with the JSON `body`."""
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _Recording(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.seen.append(dict(self.headers.items()))  # type: ignore[attr-defined]
        send_json(self, b'{"ok": true}')

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def http_upstream(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """`handler` served on a free loopback port by a thread of its own, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def recording_upstream() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An upstream on a free loopback port answering every POST with `{"ok": true}`; yields its port and the
    headers of each request it got."""
    with http_upstream(_Recording) as server:
        server.seen = []  # type: ignore[attr-defined]
        yield server.server_port, server.seen  # type: ignore[attr-defined]


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


@contextmanager
def serving_router(config: Path, text: str, wait_s: float = 60) -> Iterator[str]:
    """`d3router serve CONFIG` of the configuration `text` (written to `config`) on a free loopback port, its output in
    `router.log` beside it, until it is ready (`wait_until_ready`); yields its URL, terminates it after."""
    config.write_text(text, encoding="utf-8")
    port = free_port()
    log_path = config.parent / "router.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(url, process, log_path, wait_s)
            yield url
        finally:
            process.terminate()
            process.wait(15)


def served_openai() -> Any:
    """The fixture `sdk`: the official OpenAI client of the module's `router_url` (`sdk = served_openai()`), closed
    after its test (its pooled connections with it)."""

    @pytest.fixture(name="sdk")
    def sdk_(router_url: str) -> Iterator[openai.OpenAI]:
        with openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0) as client:
            yield client

    return sdk_


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


# --- in process ---------------------------------------------------------------------------------------------------
def proxy_clients() -> tuple[Any, Any, Any]:
    """The fixtures `http` (an httpx client), `claude` (the `anthropic` SDK, key `sk-agent`) and `gpt` (the `openai`
    SDK, key `sk-app`) of the module's `app` fixture, the router in process (the SDKs speak through httpx2):

        http, claude, gpt = proxy_clients()
    """

    @pytest.fixture(name="http")
    async def http_(app: ProxyApp) -> AsyncIterator[httpx.AsyncClient]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
            yield client

    @pytest.fixture(name="claude")
    async def claude_(app: ProxyApp) -> AsyncIterator[anthropic.AsyncAnthropic]:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as client:
            yield anthropic.AsyncAnthropic(base_url="http://router", api_key="sk-agent", http_client=client,
                                           max_retries=0)  # fmt: skip

    @pytest.fixture(name="gpt")
    async def gpt_(app: ProxyApp) -> AsyncIterator[openai.AsyncOpenAI]:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as client:
            yield openai.AsyncOpenAI(base_url="http://router/v1", api_key="sk-app", http_client=client, max_retries=0)

    return http_, claude_, gpt_


WEATHER = '{"city": "Oslo"}'  # a tool call's arguments, streamed as '{"ci' and 'ty": "Oslo"}'


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "qwen",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


def chat_reply(stream: bool, call: tuple[str, str, str] | None = None, *, split: bool = True) -> httpx.Response:
    """A chat fake's answer (model `qwen`, 9 and 4 tokens), whole or streamed: "Rainy in Oslo." or the tool call
    `call` (its id, name and arguments), its arguments streamed in two pieces (the first four characters, the rest)
    when `split`, else in one."""
    if stream:
        chunks = [chat_chunk({"role": "assistant", "content": ""})]
        if call is not None:
            call_id, name, arguments = call
            pieces = [arguments[:4], arguments[4:]] if split else [arguments]
            chunks.append(chat_chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                                      "function": {"name": name, "arguments": pieces[0]}}]}))  # fmt: skip
            chunks += [chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces[1:]]
            chunks.append(chat_chunk({}, "tool_calls"))
        else:
            chunks += [chat_chunk({"content": "Rainy"}), chat_chunk({"content": " in Oslo."}), chat_chunk({}, "stop")]
        chunks.append({**chat_chunk({}), "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=sdk.chunks_of(*chunks))
    message: dict[str, Any] = {"role": "assistant", "content": "Rainy in Oslo."}
    if call is not None:
        call_id, name, arguments = call
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}  # fmt: skip
    completion = {"id": "c1", "object": "chat.completion", "created": 1, "model": "qwen",
                  "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                  "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}  # fmt: skip
    return httpx.Response(200, json=completion)
