"""The answer names the model the client asked for (issue 26.1): JSON answers of the four APIs and their streams,
renamed in place with every other byte as it came (thinking blocks, signatures, a `model` inside a tool's input);
`server.answer_model: upstream` keeps the upstream's name; a route that kept the client's model changes nothing."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import respx

from policies import parse_config
from router import ProxyApp, create_app
from router._apis.registry import API_BY_NAME
from router._asgi.answer import Rename, model_span

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{default_policy: auto{extra}}}
upstreams:
  up: {{url: http://up.test/v1, model: up-model}}
  same: {{url: http://same.test/v1}}
policies:
  auto:
    rules: [{{name: default, route: up}}]
  kept:
    rules: [{{name: default, route: same}}]
"""
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}  # fmt: skip
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds/+Q=="
# Thinking and its signature, a tool whose input names a model, non-ASCII text escaped and not: nothing but the
# answer's own model may change.
JSON_ANSWERS = {
    "chat": b'{"id":"c1","object":"chat.completion","created":1,"model":"up-model","choices":[{"index":0,'
            b'"message":{"role":"assistant","content":"caf\\u00e9 \xc3\xa9 \\"model\\": x"},"finish_reason":"stop"}]}',
    "completions": b'{"id":"k1","object":"text_completion","model" : "up-model","choices":[{"text":"hi"}]}',
    "responses": b'{"id":"resp_1","object":"response","created_at":1,"model":"up-model","output":[{"type":'
                 b'"reasoning","encrypted_content":"' + SIGNATURE.encode() + b'","summary":[]}]}',
    "messages": b'{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"hm",'
                b'"signature":"' + SIGNATURE.encode() + b'"},{"type":"tool_use","id":"t1","name":"run","input":'
                b'{"model":"up-model"}}],"model":"up-model","stop_reason":"tool_use"}',
}  # fmt: skip


def sse(event: str | None, data: str) -> bytes:
    return (f"event: {event}\n" if event else "").encode() + b"data: " + data.encode() + b"\n\n"


MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "up-model"}
RESPONSE = {"id": "resp_1", "object": "response", "model": "up-model", "output": []}
STREAMS = {
    "messages": [
        sse("message_start", json.dumps({"type": "message_start", "message": MESSAGE})),
        sse("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"thinking",'
            '"thinking":""}}'),
        sse("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta",'
            f'"signature":"{SIGNATURE}"}}}}'),
        sse("content_block_delta", '{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
            '"partial_json":"{\\"model\\": \\"up-model\\"}"}}'),
        sse("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"}}'),
        sse("message_stop", '{"type":"message_stop"}'),
    ],
    "responses": [
        sse("response.created", json.dumps({"type": "response.created", "response": RESPONSE})),
        sse("response.in_progress", json.dumps({"type": "response.in_progress", "response": RESPONSE})),
        sse("response.output_text.delta", '{"type":"response.output_text.delta","delta":"model"}'),
        sse("response.completed", json.dumps({"type": "response.completed", "response": {**RESPONSE, "output": [
            {"type": "reasoning", "encrypted_content": SIGNATURE}]}})),
    ],
    "chat": [sse(None, json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "up-model",
                                   "choices": [{"delta": {"content": f"t{i}"}}]})) for i in range(3)]
    + [b"data: [DONE]\n\n"],
    "completions": [sse(None, '{"id":"k","model":"up-model","choices":[{"text":"a"}]}'), b"data: [DONE]\n\n"],
}  # fmt: skip
RENAMED = {"chat": 3, "completions": 1, "responses": 3, "messages": 1}  # events that name the model


def renamed(data: bytes, count: int) -> bytes:
    """`data` with its first `count` answer models (`"model":"up-model"` as JSON writes it) named `auto`."""
    for spelling in (b'"model": "up-model"', b'"model":"up-model"', b'"model" : "up-model"'):
        done = data.count(spelling)
        data = data.replace(spelling, spelling.replace(b"up-model", b"auto"), count)
        count -= min(done, count)
    return data


def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), size):
            yield data[start : start + size]

    return chunks()


async def proxy(extra: str = "") -> ProxyApp:
    return create_app(parse_config(CONFIG.format(extra=extra), "c.yaml"), transport=httpx.AsyncHTTPTransport())


def body(api: str, model: str = "auto", stream: bool = False) -> dict[str, object]:
    fields: dict[str, object] = {"model": model, "stream": stream}
    if api == "completions":
        return {**fields, "prompt": "hi"}
    if api == "responses":
        return {**fields, "input": "hi"}
    return {**fields, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


async def call(app: ProxyApp, api: str, request: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
        return await client.post(PATHS[api], json=request)


@pytest.mark.parametrize("api", list(PATHS))
async def test_a_json_answer_names_the_clients_model_and_keeps_every_other_byte(api: str) -> None:
    app = await proxy()
    try:
        with respx.mock:
            route = respx.post(f"http://up.test/v1{PATHS[api][3:]}").mock(
                return_value=httpx.Response(
                    200, content=JSON_ANSWERS[api], headers={"content-type": "application/json"}
                )
            )
            response = await call(app, api, body(api))
        assert json.loads(route.calls.last.request.content)["model"] == "up-model"
        expected = renamed(JSON_ANSWERS[api], 1)
        if api == "messages":  # the tool's input names the model first: the answer's own comes after its content
            expected = JSON_ANSWERS[api].replace(b'}}],"model":"up-model"', b'}}],"model":"auto"')
        assert response.content == expected
        assert response.json()["model"] == "auto"
        assert response.headers["content-length"] == str(len(response.content))
    finally:
        await app.aclose()


async def test_the_thinking_block_and_a_tools_model_are_left_as_they_came() -> None:
    app = await proxy()
    try:
        with respx.mock:
            respx.post("http://up.test/v1/messages").mock(
                return_value=httpx.Response(200, content=JSON_ANSWERS["messages"],
                                            headers={"content-type": "application/json"})
            )  # fmt: skip
            answer = (await call(app, "messages", body("messages"))).json()
        assert answer["model"] == "auto"
        assert answer["content"][0] == {"type": "thinking", "thinking": "hm", "signature": SIGNATURE}
        assert answer["content"][1]["input"] == {"model": "up-model"}
    finally:
        await app.aclose()


@pytest.mark.parametrize("size", [7, 64, 100_000])
@pytest.mark.parametrize("api", list(PATHS))
async def test_a_stream_names_the_clients_model_event_by_event(api: str, size: int) -> None:
    upstream = b"".join(STREAMS[api])
    app = await proxy()
    try:
        with respx.mock:
            respx.post(f"http://up.test/v1{PATHS[api][3:]}").mock(
                return_value=httpx.Response(200, content=pieces(upstream, size),
                                            headers={"content-type": "text/event-stream"})
            )  # fmt: skip
            response = await call(app, api, body(api, stream=True))
        assert response.content == renamed(upstream, RENAMED[api])
        assert response.content.count(b"up-model") == upstream.count(b"up-model") - RENAMED[api]
    finally:
        await app.aclose()


async def test_upstream_setting_keeps_the_upstreams_name() -> None:
    app = await proxy(", answer_model: upstream")
    try:
        with respx.mock:
            respx.post("http://up.test/v1/messages").mock(
                return_value=httpx.Response(200, content=b"".join(STREAMS["messages"]),
                                            headers={"content-type": "text/event-stream"})
            )  # fmt: skip
            response = await call(app, "messages", body("messages", stream=True))
        assert response.content == b"".join(STREAMS["messages"])
    finally:
        await app.aclose()


async def test_a_route_that_kept_the_clients_model_changes_nothing() -> None:
    app = await proxy()
    answer = JSON_ANSWERS["chat"].replace(b"up-model", b"their-model")
    try:
        with respx.mock:
            respx.post("http://same.test/v1/chat/completions").mock(
                return_value=httpx.Response(200, content=answer, headers={"content-type": "application/json"})
            )
            response = await call(app, "chat", body("chat", model="kept"))
        assert response.content == answer
    finally:
        await app.aclose()


async def test_a_gzip_answer_is_decoded_and_renamed() -> None:
    app = await proxy()
    try:
        with respx.mock:
            respx.post("http://up.test/v1/responses").mock(
                return_value=httpx.Response(200, content=gzip.compress(JSON_ANSWERS["responses"]),
                                            headers={"content-type": "application/json", "content-encoding": "gzip"})
            )  # fmt: skip
            response = await call(app, "responses", body("responses"))
        assert "content-encoding" not in response.headers
        assert response.content == renamed(JSON_ANSWERS["responses"], 1)
    finally:
        await app.aclose()


def test_the_model_is_found_only_where_the_api_names_it() -> None:
    paths = API_BY_NAME["messages"].answer_model
    nested = b'{"content":[{"model":"x"}],"meta":{"model":"y"},"message":{"model":"z"}}'
    span = model_span(nested, paths)
    assert span is not None and nested[span[0] : span[1]] == b'"z"'
    assert model_span(b'{"a":"\\"model\\":\\"q\\"","b":[1,{"model":"w"}]}', paths) is None
    assert model_span(b'{"model":7,"message":{"model":"m"}}', paths) == (30, 33)


def test_an_event_split_anywhere_comes_out_whole_and_renamed() -> None:
    stream = b"".join(STREAMS["responses"]).replace(b"\n", b"\r\n")
    for cut in range(1, len(stream)):
        rename = Rename(API_BY_NAME["responses"].answer_model, "auto")
        out = rename.feed(stream[:cut]) + rename.feed(stream[cut:]) + rename.flush()
        assert out == renamed(stream, 3), cut


async def test_a_stream_that_ends_inside_an_event_ends_with_it() -> None:
    upstream = STREAMS["chat"][0] + b"data: [DONE]\n"  # no blank line after the last event
    app = await proxy()
    try:
        with respx.mock:
            respx.post("http://up.test/v1/chat/completions").mock(
                return_value=httpx.Response(200, content=pieces(upstream, 5),
                                            headers={"content-type": "text/event-stream"})
            )  # fmt: skip
            response = await call(app, "chat", body("chat", stream=True))
        assert response.content == renamed(upstream, 1)
    finally:
        await app.aclose()


async def test_a_stream_broken_off_mid_event_ends_with_the_held_part_and_the_apis_error() -> None:
    first, cut = STREAMS["messages"][0], STREAMS["messages"][1][:20]

    async def breaking() -> AsyncIterator[bytes]:
        yield first + cut
        raise httpx.ReadError("gone")

    app = await proxy()
    try:
        with respx.mock:
            respx.post("http://up.test/v1/messages").mock(
                return_value=httpx.Response(200, content=breaking(), headers={"content-type": "text/event-stream"})
            )
            response = await call(app, "messages", body("messages", stream=True))
        renamed_first, rest = renamed(first, 1), response.content[len(renamed(first, 1)) :]
        assert response.content.startswith(renamed_first)
        assert rest.startswith(cut + b"\n\nevent: error\ndata: ")
    finally:
        await app.aclose()


def test_only_the_data_lines_json_is_renamed() -> None:
    rename = Rename(API_BY_NAME["chat"].answer_model, "auto")
    comment = b': a comment data: {"model":"up-model"}\n'
    event = comment + b'data: {"type":"ping"}\nid: {"model":"up-model"}\n\n'
    assert rename.feed(event) == event  # a comment's or another field's JSON is not the answer
    assert rename.feed(b'data: {"model":"up-model"}\n\n') == b'data: {"model":"auto"}\n\n'


def test_an_event_unlike_the_last_is_scanned_anew() -> None:
    rename = Rename(API_BY_NAME["chat"].answer_model, "auto")
    assert rename.feed(b'data: {"a":"x","model":"up-model"}\n\n') == b'data: {"a":"x","model":"auto"}\n\n'
    # The last event's prefix is 17 bytes long; here a string starts at byte 17 too, which is not the model.
    later = b'data: {"a":"x","b":"q","model":"up-model"}\n\n'
    assert rename.feed(later) == later.replace(b'"up-model"', b'"auto"')
    assert rename.feed(later) == later.replace(b'"up-model"', b'"auto"')  # and now like the last: no scan
