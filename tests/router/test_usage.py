"""Usage read from upstream answers (issue 29.2-3), in process: each API's JSON answer and stream, the chat stream's
usage chunk asked for and cut out, the metrics and the decision-log line, the cost at the upstream's price."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies import parse_config
from router import create_app
from router._apis.usage import UsageReader, ask_usage
from router._observe.usage import Tokens

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{decision_log: {{path: '{log}'}}}}
upstreams:
  small: {{url: http://small.test/v1, model: small-model, price: {{input: 1.0, cached_input: 0.5, output: 4.0}}}}
policies:
  auto:
    rules:
      - {{name: default, route: small}}
"""

CHAT_USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 7,
    "total_tokens": 18,
    "prompt_tokens_details": {"cached_tokens": 4},
}


def sse(*events: dict[str, Any] | str, named: bool = False) -> bytes:
    out = b""
    for event in events:
        data = event if isinstance(event, str) else json.dumps(event)
        head = f"event: {event['type']}\n" if named and isinstance(event, dict) else ""
        out += f"{head}data: {data}\n\n".encode()
    return out


CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "small-model"}
CHAT_STREAM = [
    {**CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]},
    {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
]
USAGE_CHUNK = {**CHUNK, "choices": [], "usage": CHAT_USAGE}


class Chunks(httpx.AsyncByteStream):
    def __init__(self, data: bytes, size: int) -> None:
        self.parts = [data[at : at + size] for at in range(0, len(data), size)]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


def upstream(seen: list[dict[str, Any]], size: int = 7) -> httpx.MockTransport:
    """A chat upstream streaming in `size`-byte pieces, with the usage chunk only when asked (as vLLM and OpenAI)."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if not body.get("stream"):
            answer = {"id": "c1", "object": "chat.completion", "model": "small-model", "usage": CHAT_USAGE,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}  # fmt: skip
            return httpx.Response(200, json=answer)
        asked = (body.get("stream_options") or {}).get("include_usage") is True
        data = sse(*CHAT_STREAM, *([USAGE_CHUNK] if asked else []), "[DONE]")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks(data, size))

    return httpx.MockTransport(handle)


async def serve(tmp_path: Path, seen: list[dict[str, Any]], requests: list[dict[str, Any]]) -> tuple[list[bytes], Any]:
    log = tmp_path / "decisions.jsonl"
    app = create_app(parse_config(CONFIG.format(log=log), str(tmp_path / "c.yaml")), transport=upstream(seen))
    await app.startup()
    shown = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        for body in requests:
            shown.append((await http.post("/v1/chat/completions", json=body)).content)
        metrics = (await http.get("/metrics")).text
    await app.aclose()
    return shown, ([json.loads(line) for line in log.read_text().splitlines()], metrics)


def renamed(data: bytes) -> bytes:
    """The answer as the client gets it: naming the model it asked for (server.answer_model: client)."""
    return data.replace(b'"small-model"', b'"auto"')


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "hello"}], **extra}


async def test_a_stream_that_did_not_ask_is_asked_and_the_client_sees_no_usage_chunk(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    shown, (lines, metrics) = await serve(tmp_path, seen, [chat(stream=True)])
    assert seen[0]["stream_options"] == {"include_usage": True}  # asked for upstream
    assert shown[0] == renamed(sse(*CHAT_STREAM, "[DONE]"))  # exactly what the client would get without accounting
    (line,) = lines
    assert line["usage"] == {"input": 11, "cached": 4, "output": 7}
    assert line["upstream"] == "small"
    assert line["cost"] == pytest.approx((7 * 1.0 + 4 * 0.5 + 7 * 4.0) / 1e6)
    assert 'd3router_upstream_tokens_total{group="-",key="-",kind="output",policy="auto",rule="default",' \
           'upstream="small"} 7.0' in metrics  # fmt: skip


async def test_a_stream_that_asked_keeps_its_usage_chunk_and_its_bytes(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    body = chat(stream=True, stream_options={"include_usage": True})
    shown, (lines, _) = await serve(tmp_path, seen, [body])
    assert seen[0] == {**body, "model": "small-model"}  # as the client sent it, the model rewritten
    assert shown[0] == renamed(sse(*CHAT_STREAM, USAGE_CHUNK, "[DONE]"))
    assert lines[0]["usage"] == {"input": 11, "cached": 4, "output": 7}


async def test_a_json_answer_is_read_and_passes_as_it_came(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    shown, (lines, _) = await serve(tmp_path, seen, [chat()])
    assert "stream_options" not in seen[0]
    assert json.loads(shown[0])["usage"] == CHAT_USAGE
    assert lines[0]["usage"] == {"input": 11, "cached": 4, "output": 7}


def test_ask_usage_writes_the_option_only_when_needed() -> None:
    raw = b'{"model": "m", "stream": true}'
    assert ask_usage("chat", raw, json.loads(raw)) == b'{"stream_options":{"include_usage":true},"model": "m", ' \
                                                      b'"stream": true}'  # fmt: skip
    assert ask_usage("chat", b'{"stream": false}', {"stream": False}) is None
    assert ask_usage("responses", raw, json.loads(raw)) is None  # Responses' completed event always has it
    own = {"stream": True, "stream_options": {"continuous_usage_stats": False}}
    assert json.loads(ask_usage("completions", json.dumps(own).encode(), own) or b"")["stream_options"] == {
        "continuous_usage_stats": False, "include_usage": True}  # fmt: skip


def test_ask_usage_written_anew_keeps_the_text_as_sent_compact_and_in_utf8() -> None:
    """A request with its own `stream_options` is written anew: compact, its text in UTF-8 as the client wrote it
    (not escaped to ASCII), from the bytes sent, not the client's body."""
    own = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}, "prompt": "café ☕"}
    raw = json.dumps({**own, "model": "upstream-model"}, ensure_ascii=False).encode()
    expected = (
        '{"model":"upstream-model","stream":true,"stream_options":{"continuous_usage_stats":false,'
        '"include_usage":true},"prompt":"café ☕"}'
    )
    assert ask_usage("completions", raw, own) == expected.encode()


@pytest.mark.parametrize("options", [None, "yes", ["include_usage"]])
def test_ask_usage_replaces_stream_options_that_are_not_an_object(options: object) -> None:
    body = {"model": "m", "stream": True, "stream_options": options}
    assert json.loads(ask_usage("chat", json.dumps(body).encode(), body) or b"")["stream_options"] == {
        "include_usage": True}  # fmt: skip


def test_ask_usage_of_bytes_that_are_not_an_object_starts_from_the_clients_body() -> None:
    body = {"model": "m", "stream": True, "stream_options": {}}
    for raw in (b"not json", b"[1, 2]"):
        assert json.loads(ask_usage("chat", raw, body) or b"") == {**body, "stream_options": {"include_usage": True}}


RESPONSE_USAGE = {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 5}


@pytest.mark.parametrize(
    ("api", "stream", "expected"),
    [
        ("responses", sse({"type": "response.created", "response": {"usage": None}},
                          {"type": "response.output_text.delta", "delta": "usage"},
                          {"type": "response.completed", "response": {"usage": RESPONSE_USAGE}}, named=True),
         Tokens(20, 8, 5, True)),
        ("messages", sse({"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1,
                                                                         "cache_read_input_tokens": 3}}},
                         {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
                         {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 6}}, named=True),
         Tokens(12, 3, 6, True)),
        ("completions", sse({"choices": [{"text": "x"}]}, {"choices": [], "usage": CHAT_USAGE}, "[DONE]"),
         Tokens(11, 4, 7, True)),
        ("chat", sse(*CHAT_STREAM, "[DONE]"), Tokens()),
    ],
)  # fmt: skip
@pytest.mark.parametrize("size", [1, 5, 10_000])
def test_streams_are_read_in_any_pieces_and_pass_unchanged(
    api: str, stream: bytes, expected: Tokens, size: int
) -> None:
    reader = UsageReader(api)
    watch = reader.watch()
    out = b"".join(watch.feed(stream[at : at + size]) for at in range(0, len(stream), size)) + watch.flush()
    assert out == stream
    assert reader.tokens == expected


def test_the_asked_usage_chunk_is_cut_out_in_any_pieces() -> None:
    stream = sse(*CHAT_STREAM, USAGE_CHUNK, "[DONE]")
    for size in (1, 3, 64, 10_000):
        reader = UsageReader("chat", asked=True)
        watch = reader.watch()
        out = b"".join(watch.feed(stream[at : at + size]) for at in range(0, len(stream), size)) + watch.flush()
        assert out == sse(*CHAT_STREAM, "[DONE]")
        assert reader.tokens == Tokens(11, 4, 7, True)


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        ("chat", {"usage": CHAT_USAGE}, Tokens(11, 4, 7, True)),
        ("completions", {"usage": {"prompt_tokens": 3, "completion_tokens": 2}}, Tokens(3, 0, 2, True)),
        ("responses", {"usage": RESPONSE_USAGE}, Tokens(20, 8, 5, True)),
        ("messages", {"usage": {"input_tokens": 2, "cache_creation_input_tokens": 5, "output_tokens": 4}},
         Tokens(7, 0, 4, True)),
        ("chat", {"choices": []}, Tokens()),
    ],
)  # fmt: skip
def test_json_answers_are_read(api: str, body: dict[str, Any], expected: Tokens) -> None:
    reader = UsageReader(api)
    reader.body(json.dumps(body).encode())
    assert reader.tokens == expected
