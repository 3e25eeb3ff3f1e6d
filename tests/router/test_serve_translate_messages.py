"""A Chat Completions client to a Messages-only upstream through the real `d3router serve` (issue 30): the `openai`
SDK's `chat.completions.create`, whole and streamed, calling a tool and reading its result, answered by a local fake
Messages server that checks each request it gets against the `anthropic` SDK's types (`_sdk_shapes`)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest

from d3backend import free_port
from router._translate.base import sse
from tests.router import _sdk_shapes as sdk
from tests.router._peers import stop, wait_serving

REPO = Path(__file__).resolve().parents[2]
CONFIG = """
server: {{default_policy: tomsg}}
upstreams:
  msgonly: {{url: "http://127.0.0.1:{port}/v1", model: claude-x, api: messages, api_key_env: MSG_KEY, timeout_s: 10}}
policies:
  tomsg:
    apis: [chat]
    rules: [{{name: default, route: msgonly}}]
"""
TOOLS: list[Any] = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}}]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
SIGNATURE = "c2lnbmVkLWJ5LXRoZS1mYWtl"


@dataclasses.dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _answer(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The fake model: a call of `weather` when asked with tools, the result quoted when the last turn brings it."""
    last = body["messages"][-1]["content"]
    results = [block for block in last if block.get("type") == "tool_result"] if isinstance(last, list) else []
    thinking = {"type": "thinking", "thinking": "Look it up.", "signature": SIGNATURE}
    if results:
        content = results[0]["content"]
        text = content if isinstance(content, str) else "".join(part["text"] for part in content)
        return [thinking, {"type": "text", "text": f"It is {text} ({results[0]['tool_use_id']})."}], "end_turn"
    if body.get("tools"):
        return [
            thinking,
            {"type": "tool_use", "id": "toolu_01", "name": "weather", "input": {"city": "Oslo"}},
        ], "tool_use"
    return [{"type": "text", "text": "Hi!"}], "end_turn"


def _events(message: dict[str, Any], blocks: list[dict[str, Any]], stop_reason: str) -> bytes:
    """A Messages stream: each block started empty and given in two deltas (a tool's input cut inside its JSON)."""
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                                        "usage": {"input_tokens": 12, "output_tokens": 1}}}]  # fmt: skip
    for index, block in enumerate(blocks):
        if block["type"] == "thinking":
            start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]  # fmt: skip
        elif block["type"] == "text":
            start = {"type": "text", "text": ""}
            half = len(block["text"]) // 2
            deltas = [{"type": "text_delta", "text": piece} for piece in (block["text"][:half], block["text"][half:])]
        else:
            start = {**block, "input": {}}
            arguments = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in (arguments[:5], arguments[5:])]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events += [{"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 7}}, {"type": "message_stop"}]  # fmt: skip
    return b"".join(sse(event, event["type"]) for event in events)


class _MessagesOnly(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        self.server.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body))  # type: ignore[attr-defined]
        status, kind, data = self._answer(body)
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, body: dict[str, Any]) -> tuple[int, str, bytes]:
        if self.path != "/v1/messages":
            return (
                404,
                "application/json",
                b'{"type": "error", "error": {"type": "not_found_error", "message": "Messages only"}}',
            )
        try:
            sdk.messages_request(body)  # as the anthropic SDK's types take it, else refused as Anthropic would
        except (pydantic.ValidationError, AssertionError) as exc:
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": f"not a Messages request: {exc}"},
            }
            return 400, "application/json", json.dumps(error).encode()
        blocks, stop_reason = _answer(body)
        message = {"id": "msg_01", "type": "message", "role": "assistant", "model": body["model"],
                   "stop_reason": stop_reason, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 7}}  # fmt: skip
        if body.get("stream"):
            return 200, "text/event-stream", _events(message, blocks, stop_reason)
        return 200, "application/json", json.dumps({**message, "content": blocks}).encode()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclasses.dataclass
class Served:
    url: str
    seen: list[Seen]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The fake Messages server on a free port and `d3router serve` (a process) routing chat requests to it."""
    fake = ThreadingHTTPServer(("127.0.0.1", 0), _MessagesOnly)
    fake.daemon_threads = True
    fake.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "d3router.yaml"
    config.write_text(CONFIG.format(port=fake.server_port))
    port = free_port()
    router = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                              env={**os.environ, "MSG_KEY": "sk-ant-fake"})  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        if not wait_serving(url, router, 60):
            pytest.fail("d3router serve did not start")
        yield Served(url, fake.seen)  # type: ignore[attr-defined]
    finally:
        stop(router)
        fake.shutdown()
        fake.server_close()
        thread.join(5)


@pytest.fixture
def gpt(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-client", max_retries=0) as client:
        yield client


def _result_turns(call_id: str, arguments: str) -> list[Any]:
    """The conversation after the tool ran: the assistant's call and the tool's result, in chat's shapes."""
    call = {"id": call_id, "type": "function", "function": {"name": "weather", "arguments": arguments}}
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "rainy, 7 C"}]  # fmt: skip


def test_the_openai_sdk_calls_a_tool_and_reads_its_result_through_a_messages_upstream(
    served: Served, gpt: openai.OpenAI
) -> None:
    first = gpt.chat.completions.create(model="tomsg", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and (call.id, call.function.name) == ("toolu_01", "weather")
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert first.usage is not None and (first.usage.prompt_tokens, first.usage.completion_tokens) == (12, 7)
    second = gpt.chat.completions.create(model="tomsg", messages=_result_turns(call.id, call.function.arguments),
                                         tools=TOOLS)  # fmt: skip
    assert (
        second.choices[0].message.content == "It is rainy, 7 C (toolu_01)."
        and second.choices[0].finish_reason == "stop"
    )
    asked = served.seen[-1]
    assert (asked.path, asked.headers["x-api-key"], asked.headers["anthropic-version"]) == (
        "/v1/messages", "sk-ant-fake", "2023-06-01")  # fmt: skip
    assert asked.body["model"] == "claude-x" and asked.body["tools"][0]["input_schema"]["required"] == ["city"]
    turns = asked.body["messages"]
    assert [turn["role"] for turn in turns] == ["user", "assistant", "user"]
    assert turns[1]["content"] == [{"type": "tool_use", "id": "toolu_01", "name": "weather", "input": {"city": "Oslo"}}]
    assert turns[2]["content"][0]["type"] == "tool_result" and turns[2]["content"][0]["tool_use_id"] == "toolu_01"
    raw = httpx.post(f"{served.url}/v1/chat/completions", json={"model": "tomsg", "messages": ASK, "tools": TOOLS},
                     headers={"authorization": "Bearer sk-client"}, timeout=10)  # fmt: skip
    assert raw.status_code == 200 and raw.headers["x-d3-translation-losses"] == "thinking_signature_dropped"


def test_the_openai_sdk_streams_a_tool_call_and_its_answer_through_a_messages_upstream(
    served: Served, gpt: openai.OpenAI
) -> None:
    with gpt.chat.completions.stream(model="tomsg", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                     stream_options={"include_usage": True}) as stream:  # fmt: skip
        for _ in stream:
            pass
        called = stream.get_final_completion()
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "toolu_01",
        "weather",
        {"city": "Oslo"},
    )
    assert called.usage is not None and (called.usage.prompt_tokens, called.usage.completion_tokens) == (12, 7)
    chunks = list(gpt.chat.completions.create(model="tomsg", messages=_result_turns(call.id, call.function.arguments),
                                              tools=TOOLS, stream=True))  # fmt: skip
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert (
        text == "It is rainy, 7 C (toolu_01)."
        and len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert all(chunk.usage is None for chunk in chunks)  # no usage chunk: this client did not ask for one
    assert all(seen.body.get("stream") is True for seen in served.seen)
    assert served.seen[-1].body["messages"][2]["content"][0]["tool_use_id"] == "toolu_01"
