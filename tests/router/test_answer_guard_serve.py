"""Answer guards end to end (issue 27): `d3router serve` as a process, a real upstream on a socket answering the four
APIs (streams written event by event), an engine on a socket flagging a marker, and the official `openai` and
`anthropic` SDKs. An answer carrying the marker never reaches the client; a clean one is byte for byte what the
same route without the guard gives."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from d3backend import free_port
from tests.router._peers import stop, wait_serving
from tests.router.test_answer_guard import MARKER, PATHS, answer

CONFIG = """
engine:
  remote: {{urls: ["http://127.0.0.1:{engine}"], model: d3-scripted, timeout_s: 5}}
upstreams:
  up: {{url: "http://127.0.0.1:{upstream}/v1", timeout_s: 30}}  # the client's model goes up: no rename
server: {{default_policy: guarded}}
policies:
  guarded:
    rules: [{{name: default, route: up}}]
    answer:
      window_chars: 64
      overlap_chars: 24
      questions: {{leak: {{type: noul, instructions: Does the answer reveal the secret marker?}}}}
      rules: [{{name: no-leak, when: leak > 0.8, block: {{status: 451, message: The answer was withheld.}}}}]
  plain:
    rules: [{{name: default, route: up}}]
"""


class _Active:
    """The upstream's answers being written (its handler threads)."""

    def __init__(self) -> None:
        self.lock, self.count = threading.Lock(), 0

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


ACTIVE = _Active()
GO = threading.Event()  # a paused stream (`SAY PAUSE ...`) goes on once it is set
FIRST = "the first window of a paused answer, long enough to be judged alone: "


class _Upstream(BaseHTTPRequestHandler):
    """Says what the request's text asks (`SAY ...`), in its API's shape; a stream event by event, 2 ms apart."""

    protocol_version = "HTTP/1.0"  # a stream ends when the connection closes

    def do_POST(self) -> None:
        with ACTIVE:
            ACTIVE.count += 1
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the router closed it: a withheld stream
        finally:
            with ACTIVE:
                ACTIVE.count -= 1

    def _answer(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        api = next(name for name, path in PATHS.items() if self.path.endswith(path.removeprefix("/v1")))
        text = json.dumps(body).split("SAY ", 1)[1].split('"', 1)[0]
        if text.startswith("PAUSE"):
            self._paused()
            return
        raw, kind = answer(api, bool(body.get("stream")), text)
        self.send_response(200)
        self.send_header("content-type", kind)
        if kind == "application/json":
            self.send_header("content-length", str(len(raw)))
        self.end_headers()
        for event in raw.split(b"\n\n") if kind == "text/event-stream" else [raw]:
            if event:
                self.wfile.write(event + (b"\n\n" if kind == "text/event-stream" else b""))
                self.wfile.flush()
                time.sleep(0.002)

    def _paused(self) -> None:
        """A chat stream whose first event fills a window, then nothing until `GO` (at most 10 s), then the rest."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "up", "choices": [{"index": 0}]}
        for i, text in enumerate([FIRST, "and the rest of it."]):
            if i:
                GO.wait(10)
            delta = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            self.wfile.write(f"data: {json.dumps({**chunk, 'choices': [delta]})}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Engine(BaseHTTPRequestHandler):
    """The engine's wire (SYSTEMONE.md): `leak` is yes when the judged answer holds the marker. One connection a
    call (HTTP/1.0): no handler thread waits on a kept-alive connection after a test."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        with ACTIVE:
            ACTIVE.count += 1
        try:
            self._answer()
        finally:
            with ACTIVE:
                ACTIVE.count -= 1

    def _answer(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        state = json.dumps(body.get("state"))
        answers = {}
        for name in body.get("questions") or {}:
            p = 0.97 if MARKER in state else 0.02
            answers[name] = {"type": "noul", "noul": p, "probabilities": {"yes": p, "no": 1 - p}, "confidence": 0.9}
        out = json.dumps({"id": "d", "object": "structured_decision", "created": 0, "model": body["model"],
                          "answers": answers, "usage": {"input_tokens": 1, "output_tokens": 0}}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serving(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, threading.Thread]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    peers = [_serving(_Upstream), _serving(_Engine)]
    folder = tmp_path_factory.mktemp("answer-serve")
    config = folder / "router.yaml"
    config.write_text(CONFIG.format(upstream=peers[0][0].server_port, engine=peers[1][0].server_port))
    port = free_port()
    router = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    try:
        if not wait_serving(f"http://127.0.0.1:{port}", router, 60):
            pytest.fail("d3router serve did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(router)
        for server, thread in peers:
            server.shutdown()
            server.server_close()
            thread.join(5)


@pytest.fixture(autouse=True)
def upstream_done() -> Iterator[None]:
    """Each test ends once the upstream has written (or given up on) its answers: no thread of it is left."""
    yield
    deadline = time.monotonic() + 10
    while ACTIVE.count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # its thread returns just after the count drops


def raw(url: str, api: str, stream: bool, text: str, model: str = "guarded") -> httpx.Response:
    content = f"SAY {text}"
    body: dict[str, Any] = {"model": model, "stream": stream}
    if api == "completions":
        body["prompt"] = content
    elif api == "responses":
        body["input"] = content
    else:
        body["messages"] = [{"role": "user", "content": content}]
        body["max_tokens"] = 64
    return httpx.post(url + PATHS[api], json=body, timeout=30)


CASES = [(api, stream) for api in PATHS for stream in (False, True)]
CLEAN = "a harmless answer that goes on long enough to fill a few windows of the guard, and then some more text"


@pytest.mark.parametrize(("api", "stream"), CASES)
def test_a_clean_answer_is_byte_for_byte_the_unguarded_one(url: str, api: str, stream: bool) -> None:
    guarded, plain = raw(url, api, stream, CLEAN), raw(url, api, stream, CLEAN, model="plain")
    assert guarded.status_code == plain.status_code == 200
    assert guarded.content == plain.content


@pytest.mark.parametrize(("api", "stream"), CASES)
def test_an_answer_with_the_marker_never_reaches_the_client(url: str, api: str, stream: bool) -> None:
    response = raw(url, api, stream, f"the code is {MARKER} and that is all")
    assert MARKER.encode() not in response.content and b"SECRET" not in response.content
    assert response.status_code == 451  # judged before anything went out: a short answer is one window


def test_the_openai_sdk_raises_for_a_withheld_answer_and_reads_a_clean_one(url: str) -> None:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        said = client.chat.completions.create(model="guarded", messages=[{"role": "user", "content": f"SAY {CLEAN}"}])
        assert said.choices[0].message.content == CLEAN
        with pytest.raises(openai.APIStatusError, match="The answer was withheld") as info:
            client.responses.create(model="guarded", input=f"SAY it is {MARKER}")
        assert info.value.status_code == 451
        late = f"{CLEAN} {CLEAN} and finally {MARKER}"
        with pytest.raises(openai.APIError, match="The answer was withheld"):  # a started stream ends with the error
            for _ in client.chat.completions.create(model="guarded", stream=True,
                                                    messages=[{"role": "user", "content": f"SAY {late}"}]):  # fmt: skip
                pass


def test_the_anthropic_sdk_raises_for_a_withheld_answer(url: str) -> None:
    with anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(model="guarded", max_tokens=64,
                                         messages=[{"role": "user", "content": f"SAY {CLEAN}"}])  # fmt: skip
        assert [block.text for block in message.content if block.type == "text"] == [CLEAN]
        with pytest.raises(anthropic.APIStatusError, match="The answer was withheld"):
            claude.messages.create(model="guarded", max_tokens=64,
                                   messages=[{"role": "user", "content": f"SAY it is {MARKER}"}])  # fmt: skip
        late = f"{CLEAN} {CLEAN} and finally {MARKER}"
        with pytest.raises(anthropic.APIError, match="The answer was withheld"):
            with claude.messages.stream(model="guarded", max_tokens=64,
                                        messages=[{"role": "user", "content": f"SAY {late}"}]) as events:  # fmt: skip
                for _ in events:
                    pass


def test_a_judged_window_reaches_the_client_while_the_upstream_is_still_silent(url: str) -> None:
    """Issue 27.4: a window is released when its verdict comes, not when the upstream's next event does. The
    upstream sends one window's worth and then waits for the client to have read it (up to 10 s)."""
    GO.clear()
    body = {"model": "guarded", "stream": True, "messages": [{"role": "user", "content": "SAY PAUSE"}]}
    got = b""
    started = time.monotonic()
    try:
        with httpx.stream("POST", url + PATHS["chat"], json=body, timeout=30) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            while FIRST.encode() not in got:
                got += next(chunks)
            waited = time.monotonic() - started
            assert not GO.is_set() and waited < 8, f"the first window came {waited:.1f} s late, with the rest"
            GO.set()
            got += b"".join(chunks)
    finally:
        GO.set()
    assert got.endswith(b"data: [DONE]\n\n") and b"and the rest of it." in got
