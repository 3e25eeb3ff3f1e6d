"""Bad input on the three newer decided APIs (`/v1/completions`, `/v1/responses`, `/v1/messages`): each bad body a
4xx in the endpoint's own error shape with a message naming the field, never a 5xx, the same on both faces (the
proxy and the middleware in a FastAPI app, whose handler a refused request never reaches); acceptable oddities
(NUL, CR/LF, lone surrogates, images the rules drop) a 200 that injects nothing. Plus properties: random bodies
never raise anything but `BadRequest` from an adapter, and never get a 5xx over ASGI (issue 11)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import respx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI, Request
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from d3backend import FakeEngine
from policies import StateSettings, parse_config
from router import API_BY_NAME, BadRequest, D3RouterMiddleware, MediaRules, create_app

pytestmark = pytest.mark.anyio

CONFIG = """
server: {max_body_bytes: 65536, media_hosts: [img.example.com], expose_decisions: true}
upstreams:
  small: {url: http://small.test/v1, model: small-model}
policies:
  auto:
    state: {from: conversation, max_chars: 2000}
    questions: {jailbreak: {type: noul}}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: Refused.}}
      - {name: default, route: small, tag: {x-team: a}}
"""
C, R, M = "/v1/completions", "/v1/responses", "/v1/messages"
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
PNG64 = PNG.split(",", 1)[1]
CRLF = "line one\r\nx-injected: yes\r\n\r\n"


def cmp(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "prompt": prompt, **extra}


def rsp(items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "input": items, **extra}


def user(content: Any, role: str = "user") -> list[dict[str, Any]]:
    return [{"role": role, "content": content}]


def msg(content: Any, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "max_tokens": 16, "messages": user(content, role), **extra}


def image(source: Any) -> list[dict[str, Any]]:
    return [{"type": "image", "source": source}]


def raw(path: str, inner: bytes) -> bytes:
    field = {C: b'"prompt"', R: b'"input"', M: b'"messages"'}[path]
    return b'{"model": "auto", ' + field + b": " + inner + b"}"


def deep(path: str) -> bytes:
    return raw(path, b"[" * 30_000 + b"]" * 30_000)


SURROGATE = {C: b'"\\ud800"', R: b'"\\udfff x"', M: b'[{"role": "user", "content": "\\ud800"}]'}
DUPLICATE = b'{"model": "auto", "model": "small-model", '
B64 = {"type": "base64", "media_type": "image/png", "data": PNG64}
TOOL_IMAGE = [{"type": "tool_result", "tool_use_id": "t", "content": image(B64)}]
TOOL_BAD_IMAGE = [{"type": "tool_result", "tool_use_id": "t", "content": image({"type": "url", "url": "file:///x"})}]

# (id, path, raw body or JSON value, expected status, a piece of the expected message; None for a 200)
# fmt: off
CASES: list[tuple[str, str, Any, int, str | None]] = [
    # --- /v1/completions ---------------------------------------------------------------------------------------
    ("c-prompt-missing", C, {"model": "auto"}, 400, "`prompt` is missing"),
    ("c-prompt-null", C, cmp(None), 400, "`prompt` is missing"),
    ("c-prompt-number", C, cmp(5.5), 400, "`prompt` must be a string or a list of strings, found a number"),
    ("c-prompt-object", C, cmp({"text": "hi"}), 400, "found an object"),
    ("c-prompt-bool", C, cmp(True), 400, "found a boolean"),
    ("c-prompt-empty-list", C, cmp([]), 400, "`prompt` is empty"),
    ("c-prompt-item-null", C, cmp([None]), 400, "prompt[0] must be a string, found null"),
    ("c-prompt-item-object", C, cmp(["a", {"t": 1}]), 400, "prompt[1] must be a string, found an object"),
    ("c-prompt-item-bool", C, cmp([False]), 400, "prompt[0] must be a string, found a boolean"),
    ("c-token-ids", C, cmp([1, 2, 3]), 400, "prompt has type 'token ids'"),
    ("c-token-id-lists", C, cmp([[1, 2], [3]]), 400, "prompt[0] has type 'token ids'"),
    ("c-text-then-token-ids", C, cmp(["hi", [1, 2]]), 400, "prompt[1] has type 'token ids'"),
    ("c-suffix-number", C, cmp("hi", suffix=3), 400, "suffix must be a string, found a number"),
    ("c-suffix-list", C, cmp("hi", suffix=["x"]), 400, "suffix must be a string, found a list"),
    ("c-over-size-limit", C, cmp("x" * 70_000), 413, "over 65536 bytes"),
    ("c-deep-nesting", C, deep(C), 400, "invalid JSON"),
    ("c-duplicate-key", C, DUPLICATE + b'"prompt": "hi"}', 400, "gives the key 'model' twice"),
    ("c-prompt-list", C, cmp(["one", "two"], suffix="three"), 200, None),
    ("c-many-prompts", C, cmp(["p"] * 2_000), 200, None),
    ("c-nul", C, cmp("a\u0000b"), 200, None),
    ("c-crlf", C, cmp(CRLF, suffix=CRLF), 200, None),
    ("c-lone-surrogate", C, raw(C, SURROGATE[C]), 200, None),
    # --- /v1/responses -----------------------------------------------------------------------------------------
    ("r-input-missing", R, {"model": "auto", "instructions": "x"}, 400, "`input` is missing"),
    ("r-input-null", R, rsp(None), 400, "`input` is missing"),
    ("r-input-number", R, rsp(1), 400, "input must be a string or a list of input items, found a number"),
    ("r-input-object", R, rsp({"role": "user", "content": "hi"}), 400, "found an object"),
    ("r-input-bool", R, rsp(True), 400, "found a boolean"),
    ("r-input-empty", R, rsp([]), 400, "`input` is empty"),
    ("r-item-string", R, rsp(["hi"]), 400, "input[0] must be an input item (an object)"),
    ("r-item-null", R, rsp([None]), 400, "input[0] must be an input item"),
    ("r-item-without-role", R, rsp([{"content": "hi"}]), 400, "input[0].role must be one of assistant, developer"),
    ("r-item-role-tool", R, rsp([{"role": "tool", "content": "hi"}]), 400, "input[0].role must be one of"),
    ("r-item-type-number", R, rsp([{"type": 5}]), 400, "input[0].type must be a string"),
    ("r-item-type-null", R, rsp([{"type": None, "role": "user"}]), 400, "input[0].type must be a string"),
    ("r-item-unknown-type", R, rsp([{"type": "item_reference", "id": "x"}]), 400, "has type 'item_reference'"),
    ("r-content-number", R, rsp(user(5)), 400, "input[0].content must be a string or a list of content parts"),
    ("r-part-without-type", R, rsp(user([{"text": "hi"}])), 400, "input[0].content[0] must be an object with a"),
    ("r-input-text-number", R, rsp(user([{"type": "input_text", "text": 1}])), 400, "content[0].text must be a"),
    ("r-input-file", R, rsp(user([{"type": "input_file", "file_id": "f"}])), 400, "has type 'input_file'"),
    ("r-function-call-no-name", R, rsp([{"type": "function_call", "arguments": "{}"}]), 400,
     "input[0].name must be a string, found null"),
    ("r-function-call-name-list", R, rsp([{"type": "function_call", "name": ["f"]}]), 400, "name must be a string"),
    ("r-function-call-args-object", R, rsp([{"type": "function_call", "name": "f", "arguments": {"a": 1}}]), 400,
     "input[0].arguments must be a string, found an object"),
    ("r-call-output-object", R, rsp([{"type": "function_call_output", "call_id": "c", "output": {"ok": 1}}]), 400,
     "input[0].output must be a string or a list of content parts, found an object"),
    ("r-call-output-number", R, rsp([{"type": "function_call_output", "output": 7}]), 400, "found a number"),
    ("r-input-image-no-url", R, rsp(user([{"type": "input_image", "detail": "auto"}])), 400,
     "input[0].content[0].image_url must be a string (an https or data URL), found null"),
    ("r-input-image-url-object", R, rsp(user([{"type": "input_image", "image_url": {"url": PNG}}])), 400,
     "image_url must be a string (an https or data URL), found an object"),
    ("r-input-image-file-id", R, rsp(user([{"type": "input_image", "file_id": "file-1"}])), 400,
     "input[0].content[0] is an image by file_id"),
    ("r-reasoning-summary-string", R, rsp([{"type": "reasoning", "summary": "x"}]), 400, "summary must be a list"),
    ("r-instructions-number", R, rsp("hi", instructions=3), 400, "instructions must be a string, found a number"),
    ("r-instructions-list", R, rsp("hi", instructions=["be brief"]), 400, "instructions must be a string, found a"),
    ("r-instructions-object", R, rsp("hi", instructions={"text": "x"}), 400, "found an object"),
    ("r-deep-content", R, rsp(user(json.loads("[" * 60 + "]" * 60))), 400, "input[0].content[0] must be an object"),
    ("r-huge-input-list", R, rsp([{"role": "user", "content": "m"}] * 5_000), 413, "over 65536 bytes"),
    ("r-deep-nesting", R, deep(R), 400, "invalid JSON"),
    ("r-duplicate-key", R, DUPLICATE + b'"input": "hi"}', 400, "twice"),
    ("r-many-items", R, rsp([{"role": "user", "content": "m"}] * 1_000), 200, None),
    ("r-every-item", R, rsp([
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
        {"type": "function_call_output", "call_id": "c", "output": "done"},
    ], instructions="x"), 200, None),
    ("r-image-data-url", R, rsp(user([{"type": "input_image", "image_url": PNG}])), 200, None),
    ("r-image-allowed-host", R, rsp(user([{"type": "input_image", "image_url": "https://img.example.com/a"}])),
     200, None),
    ("r-image-host-dropped", R, rsp(user([{"type": "input_image", "image_url": "http://169.254.169.254/x"}])),
     200, None),
    ("r-nul", R, rsp("a\u0000b", instructions="\u0000"), 200, None),
    ("r-crlf", R, rsp(user([{"type": "input_text", "text": CRLF}]), instructions=CRLF), 200, None),
    ("r-lone-surrogate", R, raw(R, SURROGATE[R]), 200, None),
    # --- /v1/messages ------------------------------------------------------------------------------------------
    ("m-messages-missing", M, {"model": "auto", "max_tokens": 1}, 400, "`messages` is missing"),
    ("m-messages-string", M, {"model": "auto", "messages": "hi"}, 400, "messages must be a list of messages, found"),
    ("m-messages-object", M, {"model": "auto", "messages": {"role": "user"}}, 400, "found an object"),
    ("m-messages-empty", M, {"model": "auto", "messages": []}, 400, "`messages` is empty"),
    ("m-message-string", M, {"model": "auto", "messages": ["hi"]}, 400, "messages[0] must be an object with `role`"),
    ("m-role-developer", M, msg("be brief", role="developer"), 400, "messages[0].role must be one of assistant, system"),
    ("m-role-missing", M, {"model": "auto", "messages": [{"content": "hi"}]}, 400, "role must be one of"),
    ("m-content-number", M, msg(5), 400, "messages[0].content must be a string or a list of content blocks"),
    ("m-content-null", M, msg(None), 400, "content blocks, found null"),
    ("m-content-object", M, msg({"type": "text", "text": "hi"}), 400, "content blocks, found an object"),
    ("m-block-string", M, msg(["hi"]), 400, "messages[0].content[0] must be an object with a `type`"),
    ("m-block-no-type", M, msg([{"text": "hi"}]), 400, "must be an object with a `type`"),
    ("m-block-type-number", M, msg([{"type": 3}]), 400, "must be an object with a `type`"),
    ("m-block-unknown", M, msg([{"type": "document", "source": {}}]), 400, "content[0] has type 'document'"),
    ("m-text-number", M, msg([{"type": "text", "text": 1}]), 400, "content[0].text must be a string, found a"),
    ("m-image-no-source", M, msg([{"type": "image"}]), 400, "content[0].source must be an object with a `type`"),
    ("m-image-source-string", M, msg(image(PNG)), 400, "source must be an object with a `type` (base64 or url)"),
    ("m-image-source-file", M, msg(image({"type": "file", "file_id": "f"})), 400, "source has type 'file'"),
    ("m-image-source-no-type", M, msg(image({"data": PNG64})), 400,
     "messages[0].content[0].source.type must be base64 or url, found null"),
    ("m-image-source-type-number", M, msg(image({"type": 1})), 400, "source.type must be base64 or url, found a"),
    ("m-image-no-data", M, msg(image({"type": "base64", "media_type": "image/png"})), 400,
     "source.data must be a string, found null"),
    ("m-image-media-type-number", M, msg(image({**B64, "media_type": 5})), 400,
     "source.media_type must be a string, found a number"),
    ("m-image-url-number", M, msg(image({"type": "url", "url": 5})), 400, "source.url must be a string, found a"),
    ("m-tool-use-no-name", M, msg([{"type": "tool_use", "id": "t", "input": {}}], role="assistant"), 400,
     "messages[0].content[0].name must be a string, found null"),
    ("m-tool-use-name-object", M, msg([{"type": "tool_use", "name": {}}]), 400, "name must be a string"),
    ("m-tool-result-nested", M, msg([{"type": "tool_result", "content": [{"type": "tool_result"}]}]), 400,
     "content[0].content[0] has type 'tool_result'"),
    ("m-tool-result-number", M, msg([{"type": "tool_result", "content": 1}]), 400,
     "content[0].content must be a string or a list of content blocks, found a number"),
    ("m-tool-result-by-assistant", M, msg([{"type": "tool_result", "content": "x"}], role="assistant"), 400,
     "has type 'tool_result'"),
    ("m-thinking-number", M, msg([{"type": "thinking", "thinking": 1}], role="assistant"), 400,
     "content[0].thinking must be a string"),
    ("m-system-number", M, msg("hi", system=1), 400, "system must be a string or a list of content blocks, found"),
    ("m-system-object", M, msg("hi", system={"type": "text", "text": "x"}), 400, "found an object"),
    ("m-system-strings", M, msg("hi", system=["be brief"]), 400, "system[0] must be an object with a `type`"),
    ("m-system-text-number", M, msg("hi", system=[{"type": "text", "text": 1}]), 400, "system[0].text must be a"),
    ("m-system-image", M, msg("hi", system=image(B64)), 400, "system[0] has type 'image'; `system` takes text"),
    ("m-system-tool-use", M, msg("hi", system=[{"type": "text", "text": "x"}, {"type": "tool_use", "name": "f"}]),
     400, "system[1] has type 'tool_use'; `system` takes text blocks only"),
    ("m-system-thinking", M, msg("hi", system=[{"type": "thinking", "thinking": "x"}]), 400, "takes text blocks"),
    ("m-too-many-images", M, msg(image(B64) * 17), 413, "at most 16 are allowed"),
    ("m-over-size-limit", M, msg("x" * 70_000), 413, "over 65536 bytes"),
    ("m-huge-message-list", M, {"model": "auto", "messages": user("m") * 5_000}, 413, "over 65536 bytes"),
    ("m-deep-nesting", M, deep(M), 400, "invalid JSON"),
    ("m-deep-object", M, ('{"a":' * 10_000 + "1" + "}" * 10_000).encode(), 400, "invalid JSON"),
    ("m-duplicate-key", M, DUPLICATE + b'"messages": [{"role": "user", "content": "hi"}]}', 400, "twice"),
    ("m-not-json", M, b"hello", 400, "not a JSON object"),
    ("m-text-plain", M, b'{"model": "auto"}', 415, "expected content-type application/json"),
    ("m-image-base64", M, msg(image(B64)), 200, None),
    ("m-image-url-allowed", M, msg(image({"type": "url", "url": "https://img.example.com/a.png"})), 200, None),
    ("m-image-url-dropped", M, msg(image({"type": "url", "url": "https://evil.example.com/a.png"})), 200, None),
    ("m-image-media-type-html", M, msg(image({**B64, "media_type": "text/html"})), 200, None),
    ("m-tool-result-image", M, msg(TOOL_IMAGE), 200, None),
    ("m-tool-result-bad-image", M, msg(TOOL_BAD_IMAGE), 200, None),
    ("m-thinking", M, {"model": "auto", "messages": [
        *user("q"), {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                      {"type": "redacted_thinking", "data": "x"},
                                                      {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        *user([{"type": "tool_result", "tool_use_id": "t", "content": "ok"}])]}, 200, None),
    ("m-system-blocks", M, msg("hi", system=[{"type": "text", "text": "a", "cache_control": {"type": "x"}}]), 200,
     None),
    ("m-nul", M, msg("a\u0000b", system="\u0000"), 200, None),
    ("m-crlf", M, msg([{"type": "text", "text": CRLF}], system=CRLF), 200, None),
    ("m-lone-surrogate", M, raw(M, SURROGATE[M]), 200, None),
]
# fmt: on
DROPPED = {"r-image-host-dropped", "m-image-url-dropped", "m-image-media-type-html", "m-tool-result-bad-image"}
CONTENT_TYPES = {"m-text-plain": "text/plain"}

Faces = tuple[httpx.AsyncClient, httpx.AsyncClient, list[str], FakeEngine]


def app_behind(calls: list[str], engine: FakeEngine) -> FastAPI:
    app = FastAPI()
    app.add_middleware(D3RouterMiddleware, config=parse_config(CONFIG, "c.yaml"), engine=engine)

    @app.post("/v1/chat/completions")
    @app.post(C)
    @app.post(R)
    @app.post(M)
    async def handler(request: Request) -> dict[str, Any]:
        calls.append(request.url.path)  # the body is not parsed again: only the middleware's reading is tested
        return {"decided": getattr(request.state, "d3", None) is not None}

    return app


@asynccontextmanager
async def open_faces() -> AsyncIterator[Faces]:
    """The proxy (its upstream mocked) and a FastAPI app behind the middleware, with one engine."""
    calls: list[str] = []
    engine = FakeEngine({"jailbreak": 0.1})
    proxy = create_app(parse_config(CONFIG, "c.yaml"), engine=engine, transport=httpx.AsyncHTTPTransport())
    async with (
        proxy,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://proxy") as to_proxy,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app_behind(calls, engine)), base_url="http://app")
        as to_app,
    ):  # fmt: skip
        yield to_proxy, to_app, calls, engine


def upstream() -> respx.MockRouter:
    mock = respx.mock(assert_all_called=False)
    mock.route(host="small.test").mock(return_value=httpx.Response(200, json={"upstream": True}))
    return mock


@pytest.fixture
async def faces() -> AsyncIterator[Faces]:
    with upstream():
        async with open_faces() as opened:
            yield opened


def encode(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def assert_error_shape(path: str, response: httpx.Response, status: int) -> dict[str, Any]:
    """The endpoint's own error body, exactly its keys; returns the inner error."""
    payload = response.json()
    if path == M:
        assert set(payload) == {"type", "error"} and payload["type"] == "error"
        assert set(payload["error"]) == {"type", "message"}
        assert payload["error"]["type"] == {400: "invalid_request_error", 413: "request_too_large"}.get(
            status, "invalid_request_error"
        )
    else:
        assert set(payload) == {"error"}
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        assert payload["error"]["type"] == "invalid_request_error"
    error: dict[str, Any] = payload["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error


def test_the_corpus_is_large_and_covers_each_api() -> None:
    assert len(CASES) >= 60
    assert len({case[0] for case in CASES}) == len(CASES)
    for path in (C, R, M):
        statuses = {case[3] for case in CASES if case[1] == path}
        assert {200, 400, 413} <= statuses


@pytest.mark.parametrize(("path", "body", "status", "message"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])  # fmt: skip
async def test_bad_input_on_both_faces(
    faces: Faces, path: str, body: Any, status: int, message: str | None, request: pytest.FixtureRequest
) -> None:
    to_proxy, to_app, calls, engine = faces
    case = request.node.callspec.id
    headers = {"content-type": CONTENT_TYPES.get(case, "application/json")}
    proxied = await to_proxy.post(path, content=encode(body), headers=headers)
    behind = await to_app.post(path, content=encode(body), headers=headers)
    for response in (proxied, behind):
        assert response.status_code == status, response.text
        assert "Traceback" not in response.text
        assert "x-injected" not in response.headers
    if status >= 400:
        error = assert_error_shape(path, proxied, status)
        assert message is not None and message in error["message"], error["message"]
        assert behind.json() == proxied.json()  # the same error, word for word, in the same shape
        assert calls == []  # and the app never saw the request
        return
    assert calls == [path] and behind.json() == {"decided": True}
    assert proxied.json() == {"upstream": True}
    assert proxied.headers["x-d3-rule"] == behind.headers["x-d3-rule"] == "default"
    assert proxied.headers["x-team"] == behind.headers["x-team"] == "a"
    dropped = [response.headers.get("x-d3-media-dropped") for response in (proxied, behind)]
    assert dropped == (["1", "1"] if case in DROPPED else [None, None])
    if case in DROPPED:
        assert all(call[2:] == ((), ()) for call in engine.calls)  # nothing was handed to the engine
    if case in ("m-image-base64", "m-tool-result-image"):
        assert all(call[2] == (PNG,) for call in engine.calls)


@pytest.mark.parametrize("path", [C, R, M])
async def test_nul_and_crlf_reach_the_decision_as_text(faces: Faces, path: str) -> None:
    to_proxy, _, _, engine = faces
    body = {C: cmp(CRLF + "\u0000"), R: rsp(CRLF + "\u0000"), M: msg(CRLF + "\u0000")}[path]
    response = await to_proxy.post(path, json=body)
    assert response.status_code == 200 and "x-injected" not in response.headers
    state = engine.calls[-1][0]
    assert isinstance(state, str) and CRLF + "\u0000" in state  # unchanged: text, not a header


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("api", "body"), [
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": nested(5_000)}}]}]}),
    ("messages", msg([{"type": "tool_use", "name": "f", "input": nested(5_000)}], role="assistant")),
])  # fmt: skip
def test_tool_input_nested_past_the_recursion_limit_is_a_bad_request(api: str, body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest, match="nested too deeply") as caught:
        API_BY_NAME[api].state(body, StateSettings("conversation", 100), MediaRules())
    assert caught.value.status == 400 and caught.value.param is not None


def deep_bodies(depth: int) -> list[tuple[str, bytes]]:
    hole = "@nested@"
    bodies = [
        (M, msg([{"type": "tool_use", "name": "f", "input": hole}], role="assistant")),
        ("/v1/chat/completions", {"model": "auto", "messages": [
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": hole}}]}]}),
        (R, rsp("hi", metadata=hole)),  # read by no adapter, written out again for the upstream's model
    ]  # fmt: skip
    value = ("[" * depth + "]" * depth).encode()
    return [(path, json.dumps(body).encode().replace(f'"{hole}"'.encode(), value)) for path, body in bodies]


async def test_bodies_nested_up_to_the_parsers_limit_never_get_a_5xx(faces: Faces) -> None:
    # Python's JSON parser and encoder share the recursion limit, so a body the parser just accepted could be too
    # deep to render again a few stack frames further down: every depth around the limit, on both faces.
    to_proxy, to_app, _, _ = faces
    seen: set[int] = set()
    # The limit moves with the stack already in use (coverage's tracer deepens it): sweep wide, finely near 1,000.
    for depth in [*range(400, 930, 10), *range(930, 1000)]:
        for path, body in deep_bodies(depth):
            for client in (to_proxy, to_app):
                response = await client.post(path, content=body, headers={"content-type": "application/json"})
                assert response.status_code in (200, 400), response.text
                seen.add(response.status_code)
    assert seen == {200, 400}  # the sweep crossed the limit


# --- properties -----------------------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)
texts = st.text(max_size=24) | st.sampled_from(["", "\u0000", CRLF, "\ud800", "x" * 300])
urls = st.sampled_from([PNG, "https://img.example.com/a.png", "https://evil.example.com/a.png", "file:///etc/passwd",
                        "", "data:text/html;base64,PGI+", "http://[::1", "javascript:alert(1)"])  # fmt: skip
odd = json_values | texts


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `strategy`, one time in eight something else of any type."""
    return st.integers(0, 7).flatmap(lambda pick: odd if pick == 0 else strategy)


prompts = maybe(texts | st.lists(texts | st.integers(0, 50_000) | st.lists(st.integers(0, 9), max_size=3) | odd,
                                 max_size=4))  # fmt: skip
completions = st.fixed_dictionaries({"prompt": prompts}, optional={"suffix": maybe(texts), "max_tokens": odd})

openai_parts = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["input_text", "output_text", "refusal", "input_image", "input_file",
                                    "summary_text", "image_url", "text", "x"]))},
    optional={"text": maybe(texts), "refusal": maybe(texts), "image_url": maybe(urls), "file_id": maybe(texts),
              "detail": odd},
)  # fmt: skip
openai_content = maybe(texts | st.lists(maybe(openai_parts), max_size=3))
items = st.one_of(
    st.fixed_dictionaries({}, optional={"type": maybe(st.just("message")), "content": openai_content,
                                        "role": maybe(st.sampled_from(["user", "assistant", "system", "developer",
                                                                       "tool"]))}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call", "custom_tool_call"])},
                          optional={"name": maybe(texts), "arguments": maybe(texts), "input": maybe(texts)}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call_output", "custom_tool_call_output"])},
                          optional={"output": openai_content, "call_id": texts}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference", "web_search_call"])},
                          optional={"summary": maybe(st.lists(openai_parts, max_size=2)), "id": texts}),
    odd,
)  # fmt: skip
responses = st.fixed_dictionaries(
    {"input": maybe(texts | st.lists(items, max_size=5))}, optional={"instructions": maybe(texts)}
)

sources = maybe(st.fixed_dictionaries(
    {},
    optional={"type": maybe(st.sampled_from(["base64", "url", "file"])), "media_type": maybe(st.sampled_from(["image/png", "image/jpeg", "text/html"])), "data": maybe(texts),
              "url": maybe(urls), "file_id": texts},
))  # fmt: skip
leaf_blocks = maybe(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": maybe(texts)}),
        st.fixed_dictionaries({"type": st.just("image"), "source": sources}),
        st.fixed_dictionaries({"type": st.just("thinking"), "thinking": maybe(texts)}),
        st.fixed_dictionaries({"type": st.just("tool_use"), "name": maybe(texts)}, optional={"input": odd}),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["redacted_thinking", "document", "x"])}, optional={"data": odd}
        ),
    )
)
blocks = leaf_blocks | st.fixed_dictionaries(
    {"type": st.just("tool_result")}, optional={"content": maybe(texts | st.lists(leaf_blocks, max_size=3))}
)
anthropic_messages = st.fixed_dictionaries(
    {
        "role": maybe(st.sampled_from(["user", "user", "assistant", "system"])),
        "content": maybe(texts | st.lists(blocks, max_size=3)),
    },
)
messages = st.fixed_dictionaries(
    {"messages": maybe(st.lists(maybe(anthropic_messages), min_size=1, max_size=3))},
    optional={"system": maybe(texts | st.lists(leaf_blocks, max_size=2)), "max_tokens": odd},
)
BODIES = {"completions": completions, "responses": responses, "messages": messages}
PATH_OF = {"completions": C, "responses": R, "messages": M}
EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("api", list(BODIES))
@EXAMPLES
@given(data=st.data(), source=st.sampled_from(["last_user", "conversation", "json"]), lenient=st.booleans())
def test_random_bodies_raise_nothing_but_bad_request(api: str, data: st.DataObject, source: str, lenient: bool
                                                     ) -> None:  # fmt: skip
    body = data.draw(BODIES[api])
    rules = MediaRules(frozenset({"img.example.com"}), max_bytes=1000, max_items=2)
    try:
        state = API_BY_NAME[api].state(body, StateSettings(source, 300), rules, lenient=lenient)  # type: ignore[arg-type]
    except BadRequest as exc:
        event(f"BadRequest {exc.status}")
        assert exc.message and exc.status in (400, 413)
        return
    event("read")
    assert len(state.images) + len(state.videos) <= 2
    assert all(url.startswith((PNG[:5], "https://img.example.com/")) for url in state.images)
    if source != "json":
        assert isinstance(state.state, str) and len(state.state) <= 300


@pytest.fixture(scope="module")
def asgi() -> Iterator[tuple[BlockingPortal, Faces]]:
    """Both faces on an event loop in a thread, for Hypothesis' synchronous tests."""
    with upstream(), start_blocking_portal() as portal, portal.wrap_async_context_manager(open_faces()) as opened:
        yield portal, opened


@pytest.mark.parametrize("api", list(BODIES))
@EXAMPLES
@given(data=st.data())
def test_random_bodies_never_get_a_5xx_on_either_face(asgi: tuple[BlockingPortal, Faces], api: str,
                                                      data: st.DataObject) -> None:  # fmt: skip
    portal, (to_proxy, to_app, calls, _) = asgi
    path = PATH_OF[api]
    raw_body = json.dumps({**data.draw(BODIES[api]), "model": "auto"}).encode()
    calls.clear()
    headers = {"content-type": "application/json"}
    proxied = portal.call(lambda: to_proxy.post(path, content=raw_body, headers=headers))
    behind = portal.call(lambda: to_app.post(path, content=raw_body, headers=headers))
    event(f"status {proxied.status_code}")
    assert proxied.status_code < 500 and "Traceback" not in proxied.text
    assert behind.status_code == proxied.status_code
    if proxied.status_code >= 400:
        assert_error_shape(path, proxied, proxied.status_code)
        assert behind.json() == proxied.json() and calls == []
    else:
        assert proxied.headers["x-d3-rule"] == behind.headers["x-d3-rule"] == "default"
        assert calls == [path]
