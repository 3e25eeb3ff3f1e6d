"""End to end (issue 30): the `anthropic` SDK through `d3router serve` to a real vLLM addressed only through its Chat
Completions API (a gate in front of it answers 404 to any other path and records what it was asked), streamed and
not, with tools and a tool result; the real engine deciding."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import pytest

from d3backend import VllmServer
from tests.conftest import SERVED_MODEL
from tests.router._peers import serving_router

pytestmark = pytest.mark.engine

TOOLS: list[Any] = [{"name": "weather", "description": "The weather in a city",
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]  # fmt: skip


@contextmanager
def chat_only(target: str) -> Iterator[tuple[str, list[str]]]:
    """A gate on a free loopback port passing `POST /v1/chat/completions` to `target` (streamed as it comes) and
    answering 404 to anything else; yields its URL and the paths it was asked."""
    paths: list[str] = []

    class Gate(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends with the connection: the stream passes as it comes

        def do_POST(self) -> None:
            paths.append(self.path)
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            with httpx.Client(timeout=120) as client, client.stream(
                "POST", target + self.path, content=body, headers={"content-type": "application/json"}
            ) as response:  # fmt: skip
                self.send_response(response.status_code)
                self.send_header("content-type", response.headers.get("content-type", "application/json"))
                self.end_headers()
                for chunk in response.iter_raw():
                    self.wfile.write(chunk)
                    self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def gated(vllm_server: VllmServer) -> Iterator[tuple[str, list[str]]]:
    with chat_only(vllm_server.url) as gate:
        yield gate


@pytest.fixture(scope="module")
def router_url(
    vllm_server: VllmServer, gated: tuple[str, list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    config = tmp_path_factory.mktemp("e2e-translate") / "router.yaml"
    text = f"""
server: {{expose_decisions: true}}
engine:
  remote: {{urls: ["{vllm_server.url}"], model: {SERVED_MODEL}, timeout_s: 10}}
  max_choice_options: 26
upstreams:
  chatonly: {{url: "{gated[0]}/v1", model: {SERVED_MODEL}, api: chat}}
policies:
  claude:
    apis: [messages]
    questions: {{kind: {{type: choice, criteria: {{code: Writing code, chat: Anything else}}}}}}
    rules:
      - {{name: any-kind, when: kind.code >= 0, route: chatonly, set: {{max_tokens: 8}}}}
      - {{name: default, route: chatonly}}
"""
    with serving_router(config, text) as url:
        yield url


@pytest.fixture
def claude(router_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=router_url, api_key="unused", max_retries=0) as client:
        yield client


CONVERSATION: list[Any] = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                      {"type": "tool_use", "id": "toolu_01", "name": "weather",
                                       "input": {"city": "Oslo"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "Rain, 8C"}]},
]  # fmt: skip


def test_the_anthropic_sdk_through_a_chat_only_vllm(claude: anthropic.Anthropic, gated: tuple[str, list[str]]) -> None:
    raw = claude.messages.with_raw_response.create(
        model="claude", max_tokens=64, system="Be brief.", messages=CONVERSATION, tools=TOOLS,
        tool_choice={"type": "none"},
    )  # fmt: skip
    message = raw.parse()  # the SDK's own types: it is a Message
    assert message.type == "message" and message.role == "assistant" and message.model == "claude"
    assert message.stop_reason in ("max_tokens", "end_turn") and message.usage.output_tokens <= 8
    assert message.usage.input_tokens > 0
    assert (raw.headers["x-d3-rule"], raw.headers["x-d3-upstream"]) == ("any-kind", "chatonly")
    with claude.messages.stream(model="claude", max_tokens=8, messages=CONVERSATION, tools=TOOLS,
                                tool_choice={"type": "none"}) as stream:  # fmt: skip
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason in ("max_tokens", "end_turn") and final.usage.output_tokens >= 1
    assert set(gated[1]) == {"/v1/chat/completions"}  # the vLLM was asked through its chat API only


def test_an_upstream_refusal_is_an_anthropic_error(claude: anthropic.Anthropic) -> None:
    """vLLM refuses a negative temperature: the SDK raises its own error, in Anthropic's shape."""
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="claude", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                               extra_body={"temperature": -5})  # fmt: skip
    assert info.value.body is not None and info.value.body["type"] == "error"  # type: ignore[index]
