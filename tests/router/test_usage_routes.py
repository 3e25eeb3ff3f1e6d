"""Usage on the routes that came beside it (issue 29.2 with 30 and 31): a translated route counts the tokens of the
answer in the client's API, a chat stream to a Messages upstream shows the client no usage chunk it did not ask for,
a speculative request (`overlap:`) is sent asking for the usage chunk exactly as the decided one would be, and the
ask keeps what the route rewrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from d3backend import FakeEngine
from policies import parse_config
from router import create_app
from router._apis.usage import ask_usage
from tests.router.test_usage import CHAT_STREAM, CHAT_USAGE, USAGE_CHUNK, Chunks, sse

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{decision_log: {{path: '{log}'}}, expose_decisions: true}}
upstreams:
  chatup: {{url: http://chat.test/v1, model: small-model, api: chat}}
  msgup: {{url: http://msg.test/v1, model: claude-x, api: messages}}
  native: {{url: http://chat.test/v1, model: small-model}}
policies:
  tochat:
    apis: [messages, chat]
    rules: [{{name: default, route: chatup}}]
  tomsg:
    apis: [chat]
    rules: [{{name: default, route: msgup}}]
  ahead:
    overlap: {{when: always, route: native}}
    questions: {{j: {{type: noul}}}}
    rules:
      - {{name: guard, when: j > 0.5, block: {{status: 403, message: refused}}}}
      - {{name: default, route: native}}
"""
MESSAGES_STREAM = [
    {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                          "model": "claude-x", "stop_reason": None, "stop_sequence": None,
                                          "usage": {"input_tokens": 9, "output_tokens": 1,
                                                    "cache_read_input_tokens": 3}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 6}},
    {"type": "message_stop"},
]  # fmt: skip


def handler(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    """A chat upstream (usage chunk only when asked) on chat.test, a Messages one on msg.test; 3-byte pieces."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        events = {"content-type": "text/event-stream"}
        if request.url.host == "msg.test":
            return httpx.Response(200, headers=events, stream=Chunks(sse(*MESSAGES_STREAM, named=True), 3))
        if not body.get("stream"):
            answer = {"id": "c1", "object": "chat.completion", "created": 1, "model": "small-model",
                      "usage": CHAT_USAGE, "choices": [{"index": 0, "finish_reason": "stop",
                                                        "message": {"role": "assistant", "content": "hi"}}]}  # fmt: skip
            return httpx.Response(200, json=answer)
        asked = (body.get("stream_options") or {}).get("include_usage") is True
        data = sse(*CHAT_STREAM, *([USAGE_CHUNK] if asked else []), "[DONE]")
        return httpx.Response(200, headers=events, stream=Chunks(data, 3))

    return httpx.MockTransport(handle)


async def serve(tmp_path: Path, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]],
                                                                         list[dict[str, Any]]]:  # fmt: skip
    """The client's response, what the upstreams were sent and the decision log's lines."""
    log, seen = tmp_path / "decisions.jsonl", []
    config = parse_config(CONFIG.format(log=log), str(tmp_path / "c.yaml"))
    app = create_app(config, engine=FakeEngine({"j": 0.1}), transport=handler(seen))
    await app.startup()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            response = await http.post(path, json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    finally:
        await app.aclose()
    return response, seen, [json.loads(line) for line in log.read_text().splitlines()]


def messages(stream: bool) -> dict[str, Any]:
    return {"model": "tochat", "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_messages_client_on_a_chat_upstream_counts_the_translated_answers_tokens(
    tmp_path: Path, stream: bool
) -> None:
    response, seen, (line,) = await serve(tmp_path, "/v1/messages", messages(stream))
    assert response.status_code == 200, response.text
    if stream:
        assert seen[0]["stream_options"] == {"include_usage": True}  # the translation asks: message_delta needs it
        assert b"message_delta" in response.content
    else:
        assert response.json()["usage"]["output_tokens"] == 7
    assert line["upstream"] == "chatup" and line["usage"] == {"input": 11, "cached": 4, "output": 7}


async def test_a_chat_stream_to_a_messages_upstream_is_counted_and_shows_no_usage_chunk(tmp_path: Path) -> None:
    body = {"model": "tomsg", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    response, _, (line,) = await serve(tmp_path, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    chunks = [json.loads(part[6:]) for part in response.text.split("\n\n") if part.startswith("data: {")]
    assert chunks and all(chunk.get("choices") for chunk in chunks), "a usage chunk the client did not ask for"
    assert all("usage" not in chunk or chunk["usage"] is None for chunk in chunks)
    assert line["upstream"] == "msgup" and line["usage"] == {"input": 12, "cached": 3, "output": 6}


async def test_a_speculative_stream_asks_for_usage_as_the_decided_one_would(tmp_path: Path) -> None:
    body = {"model": "ahead", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    response, seen, (line,) = await serve(tmp_path, "/v1/chat/completions", body)
    assert response.status_code == 200 and response.headers["x-d3-speculative"] == "used"
    assert len(seen) == 1 and seen[0]["stream_options"] == {"include_usage": True}
    assert response.text.count("data: {") == len(CHAT_STREAM), "the usage chunk the router asked for is cut out"
    assert line["overlap"]["outcome"] == "used" and line["usage"] == {"input": 11, "cached": 4, "output": 7}


def test_the_ask_keeps_the_routes_rewrite_when_the_client_had_stream_options() -> None:
    client = {"model": "auto", "stream": True, "stream_options": {"continuous_usage_stats": True}}
    rewritten = json.dumps({**client, "model": "small-model", "temperature": 0.5}).encode()
    asked = json.loads(ask_usage("chat", rewritten, client) or b"{}")
    assert asked["model"] == "small-model" and asked["temperature"] == 0.5
    assert asked["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
