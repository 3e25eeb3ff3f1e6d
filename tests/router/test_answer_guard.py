"""Answer guards (issue 27): the upstream's answer judged before it reaches the client, on the four APIs, streamed
and not. In-process: a fake engine that flags a marker or a destructive command, RESPX upstreams answering in each
API's shape (a stream's marker split across two events)."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
import respx
from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from d3backend import EngineUnavailable, FakeEngine
from policies import ConfigError, parse_config
from router import D3RouterMiddleware, ProxyApp, create_app
from router._apis.answers import Call, read_answer
from router._cli.main import main

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{default_policy: guarded}}
upstreams: {{up: {{url: http://up.test/v1}}}}  # the client's model goes up: no rename
policies:
  guarded:
    rules: [{{name: default, route: up}}]
    answer:
      {extra}
      questions:
        leak: {{type: noul, instructions: Does the answer reveal the secret marker?}}
        destructive: {{type: noul, instructions: Does a tool call delete files or run downloaded code?}}
      rules:
        - {{name: no-destruction, when: destructive > 0.8, block: {{status: 403, message: That command was refused.}}}}
        - {{name: no-leak, when: leak > 0.8, {leak}}}
"""
BLOCK = "block: {status: 451, message: The answer was withheld.}"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}  # fmt: skip
MARKER = "SECRET-7731"


class SlowEngine(FakeEngine):
    """A fake engine whose answers come from an async function (to hold a judgement open)."""

    def __init__(self, answers: Any) -> None:
        super().__init__()
        self.slow = answers

    async def decide(self, state: Any, questions: Any, **kwargs: Any) -> Any:
        self.answers = await self.slow(state, questions)
        return await super().decide(state, questions, **kwargs)


def verdicts(state: Any, questions: Any) -> dict[str, Any]:
    answer = json.dumps({key: state.get(key) for key in ("answer", "tool_calls")}) if isinstance(state, dict) else ""
    return {"leak": 0.99 if MARKER in answer else 0.01, "destructive": 0.99 if "rm -rf" in answer else 0.01}


def request(api: str, stream: bool) -> dict[str, Any]:
    text = "What is in the vault?"
    if api == "chat":
        return {"model": "guarded", "stream": stream, "messages": [{"role": "user", "content": text}]}
    if api == "completions":
        return {"model": "guarded", "stream": stream, "prompt": text}
    if api == "responses":
        return {"model": "guarded", "stream": stream, "input": text}
    return {"model": "guarded", "stream": stream, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


def sse(*events: dict[str, Any] | str) -> bytes:
    out = b""
    for event in events:
        if isinstance(event, str):
            out += f"data: {event}\n\n".encode()
        elif "type" in event:
            out += f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
        else:
            out += f"data: {json.dumps(event)}\n\n".encode()
    return out


def answer(api: str, stream: bool, text: str, command: str | None = None) -> tuple[bytes, str]:
    """The upstream's answer saying `text` (streamed: in two halves, so a marker is split across events), with a
    shell tool call running `command` where the API has tool calls."""
    half = len(text) // 2
    first, second = text[:half], text[half:]
    args = json.dumps({"command": command}) if command else None
    if not stream:
        if api == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if args:
                message["tool_calls"] = [
                    {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": args}}
                ]
            body: dict[str, Any] = {"id": "x", "object": "chat.completion", "model": "up-model",
                                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        elif api == "completions":
            body = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": text}]}
        elif api == "responses":
            output: list[dict[str, Any]] = [{"type": "message", "role": "assistant",
                                             "content": [{"type": "output_text", "text": text}]}]  # fmt: skip
            if args:
                output.append({"type": "function_call", "call_id": "c1", "name": "shell", "arguments": args})
            body = {"id": "resp_1", "object": "response", "status": "completed", "output": output}
        else:
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            if command:
                content.append({"type": "tool_use", "id": "t1", "name": "shell", "input": {"command": command}})
            body = {"id": "msg_1", "type": "message", "role": "assistant", "content": content, "model": "up-model",
                    "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
        return json.dumps(body).encode(), "application/json"
    if api == "chat":
        events: list[dict[str, Any] | str] = [
            {"id": "x", "choices": [{"index": 0, "delta": {"content": part}}]} for part in (first, second)
        ]
        if args:
            # The tool's name in the first delta only, as OpenAI streams it; its arguments in two pieces.
            events += [{"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "c1", "function": {"name": name, "arguments": piece}}]}}]}
                for name, piece in (("shell", args[:9]), ("", args[9:]))]  # fmt: skip
        events.append("[DONE]")
    elif api == "completions":
        events = [{"id": "x", "choices": [{"index": 0, "text": part}]} for part in (first, second)] + ["[DONE]"]
    elif api == "responses":
        events = [{"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}]
        events += [{"type": "response.output_text.delta", "delta": part} for part in (first, second)]
        if args:
            events.append({"type": "response.output_item.done", "output_index": 1,
                           "item": {"type": "function_call", "name": "shell", "arguments": args}})  # fmt: skip
    else:
        events = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                        "content": [], "model": "up-model"}},
                  {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]  # fmt: skip
        events += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}}
                   for part in (first, second)]  # fmt: skip
        if args:
            events += [
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "tool_use", "id": "t1", "name": "shell", "input": {}},
                }
            ]
            events += [{"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                                             "partial_json": piece}}
                       for piece in (args[:9], args[9:])]  # fmt: skip
        events.append({"type": "message_stop"})
    return sse(*events), "text/event-stream"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(verdicts)


async def served(engine: FakeEngine, upstream: tuple[bytes, str], *, leak: str = BLOCK, extra: str = "",
                 encoding: str | None = None) -> AsyncIterator[httpx.AsyncClient]:  # fmt: skip
    body, kind = upstream
    headers = {"content-type": kind}
    if encoding == "gzip":
        body, headers["content-encoding"] = gzip.compress(body), "gzip"
    config = parse_config(CONFIG.format(leak=leak, extra=extra), "c.yaml")
    app: ProxyApp = create_app(config, engine=engine, transport=httpx.AsyncHTTPTransport())
    with respx.mock(assert_all_called=True) as mock:
        mock.route(host="up.test").mock(return_value=httpx.Response(200, content=body, headers=headers))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            yield http
    await app.aclose()


async def post(engine: FakeEngine, api: str, stream: bool, upstream: tuple[bytes, str], **kwargs: Any
               ) -> httpx.Response:  # fmt: skip
    async for http in served(engine, upstream, **kwargs):
        return await http.post(PATHS[api], json=request(api, stream))
    raise AssertionError("unreachable")


CASES = [(api, stream) for api in PATHS for stream in (False, True)]


@pytest.mark.parametrize(("api", "stream"), CASES)
async def test_an_answer_with_the_marker_is_withheld_in_the_apis_shape(engine: FakeEngine, api: str, stream: bool
                                                                       ) -> None:  # fmt: skip
    response = await post(engine, api, stream, answer(api, stream, f"The code is {MARKER}, keep it."))
    assert response.status_code == 451
    assert MARKER.encode() not in response.content and b"SECRET" not in response.content
    error = response.json()
    if api == "messages":
        assert error["type"] == "error" and error["error"]["message"] == "The answer was withheld."
    else:
        assert error["error"]["message"] == "The answer was withheld."
    state = engine.calls[-1][0]
    assert isinstance(state, dict) and MARKER in state["answer"], "the engine read the whole answer, halves joined"


@pytest.mark.parametrize(("api", "stream"), CASES)
async def test_a_clean_answer_passes_byte_for_byte(engine: FakeEngine, api: str, stream: bool) -> None:
    upstream = answer(api, stream, "The vault holds nothing of note.")
    response = await post(engine, api, stream, upstream)
    assert response.status_code == 200
    assert response.content == upstream[0]
    assert response.headers["content-type"] == upstream[1]


@pytest.mark.parametrize(("api", "stream"), [case for case in CASES if case[0] != "completions"])
async def test_a_destructive_tool_call_is_blocked_before_any_argument_reaches_the_client(
    engine: FakeEngine, api: str, stream: bool
) -> None:
    response = await post(engine, api, stream, answer(api, stream, "Cleaning up.", command="rm -rf ~"))
    assert response.status_code == 403
    assert b"rm -rf" not in response.content and b'"command"' not in response.content
    state = engine.calls[-1][0]
    assert isinstance(state, dict) and state["tool_calls"] == [
        {"name": "shell", "arguments": '{"command": "rm -rf ~"}'}
    ]


async def test_a_gzip_encoded_answer_is_judged_decoded(engine: FakeEngine) -> None:
    response = await post(engine, "chat", False, answer("chat", False, f"It is {MARKER}."), encoding="gzip")
    assert response.status_code == 451


async def test_a_gzip_encoded_clean_answer_reaches_the_client_decoded(engine: FakeEngine) -> None:
    upstream = answer("chat", False, "Nothing here.")
    response = await post(engine, "chat", False, upstream, encoding="gzip")
    assert response.status_code == 200 and response.content == upstream[0]
    assert "content-encoding" not in response.headers


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_reads_a_replaced_answer(engine: FakeEngine, stream: bool) -> None:
    async for http in served(engine, answer("chat", stream, f"It is {MARKER}."), leak="replace: I cannot share that."):
        async with openai.AsyncOpenAI(api_key="k", base_url="http://router/v1", http_client=http) as client:
            messages: Any = [{"role": "user", "content": "What is in the vault?"}]
            if stream:
                chunks = await client.chat.completions.create(model="guarded", messages=messages, stream=True)
                text = "".join([chunk.choices[0].delta.content or "" async for chunk in chunks if chunk.choices])
            else:
                completion = await client.chat.completions.create(model="guarded", messages=messages)
                text = completion.choices[0].message.content or ""
                assert completion.choices[0].finish_reason == "stop" and completion.model == "guarded"
    assert text == "I cannot share that."


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_reads_a_replaced_answer(engine: FakeEngine, stream: bool) -> None:
    upstream = answer("messages", stream, f"It is {MARKER}.")
    config = parse_config(CONFIG.format(leak="replace: I cannot share that.", extra=""), "c.yaml")
    app = create_app(config, engine=engine, transport=httpx.AsyncHTTPTransport())
    body, kind = upstream
    with respx.mock(assert_all_called=True) as mock:
        mock.route(host="up.test").mock(return_value=httpx.Response(200, content=body, headers={"content-type": kind}))
        # The anthropic SDK brings its own HTTP client package (httpx2), with the same in-process transport.
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://router")
        async with anthropic.AsyncAnthropic(api_key="k", base_url="http://router", http_client=http) as client:
            messages: Any = [{"role": "user", "content": "What is in the vault?"}]
            if stream:
                async with client.messages.stream(model="guarded", max_tokens=64, messages=messages) as events:
                    message = await events.get_final_message()
            else:
                message = await client.messages.create(model="guarded", max_tokens=64, messages=messages)
    await app.aclose()
    assert [block.text for block in message.content if block.type == "text"] == ["I cannot share that."]
    assert message.stop_reason == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_responses_api_reads_a_replaced_answer(engine: FakeEngine, stream: bool) -> None:
    upstream = answer("responses", stream, f"It is {MARKER}.")
    async for http in served(engine, upstream, leak="replace: I cannot share that."):
        async with openai.AsyncOpenAI(api_key="k", base_url="http://router/v1", http_client=http) as client:
            if stream:
                async with client.responses.stream(model="guarded", input="What is in the vault?") as events:
                    final = await events.get_final_response()
            else:
                final = await client.responses.create(model="guarded", input="What is in the vault?")
    assert final.output_text == "I cannot share that."


async def test_an_engine_that_cannot_judge_withholds_the_answer() -> None:
    engine = FakeEngine(error=EngineUnavailable("down"))
    response = await post(engine, "chat", False, answer("chat", False, "Nothing here."))
    assert response.status_code == 503
    assert b"Nothing here" not in response.content


async def test_on_engine_error_pass_lets_an_unjudged_answer_through() -> None:
    engine = FakeEngine(error=EngineUnavailable("down"))
    upstream = answer("chat", False, "Nothing here.")
    response = await post(engine, "chat", False, upstream, extra="on_engine_error: pass")
    assert response.status_code == 200 and response.content == upstream[0]


async def test_an_answer_over_the_bound_is_refused_not_sent(engine: FakeEngine) -> None:
    response = await post(engine, "chat", False, answer("chat", False, "x" * 5000), extra="max_answer_bytes: 1000")
    assert response.status_code == 502
    assert b"xxxx" not in response.content
    assert "max_answer_bytes" in response.json()["error"]["message"]


async def test_the_engine_reads_the_request_beside_the_answer(engine: FakeEngine) -> None:
    await post(engine, "chat", False, answer("chat", False, "Nothing here."))
    state = engine.calls[-1][0]
    assert isinstance(state, dict) and "What is in the vault?" in json.dumps(state["request"])


async def test_a_long_answer_is_read_whole_in_overlapping_slices(engine: FakeEngine) -> None:
    text = "y" * 300 + MARKER
    response = await post(engine, "chat", False, answer("chat", False, text),
                          extra="max_chars: 100\n      overlap_chars: 20")  # fmt: skip
    assert response.status_code == 451, "the marker past max_chars is read"
    read = [call[0]["answer"] for call in engine.calls if isinstance(call[0], dict)]
    assert all(len(piece) <= 100 for piece in read) and MARKER in read[-1]


# --- streams in windows ------------------------------------------------------------------------------------------
WINDOWED = "window_chars: 40\n      overlap_chars: 16"


def chat_stream(*pieces: str, calls: tuple[str, ...] = ()) -> tuple[bytes, str]:
    events: list[dict[str, Any] | str] = [
        {"id": "x", "choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces
    ]
    for index, piece in enumerate(calls):
        delta = {"index": 0, "id": "c1", "function": {"name": "shell" if index == 0 else "", "arguments": piece}}
        events.append({"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    events += [{"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]"]
    return sse(*events), "text/event-stream"


async def test_a_long_clean_stream_passes_whole_in_windows(engine: FakeEngine) -> None:
    upstream = chat_stream(*(f"line {i} of a long and harmless answer. " for i in range(30)))
    response = await post(engine, "chat", True, upstream, extra=WINDOWED)
    assert response.status_code == 200 and response.content == upstream[0]
    assert len(engine.calls) > 10, "judged window by window"


async def test_a_marker_late_in_a_stream_ends_it_with_the_apis_error_event(engine: FakeEngine) -> None:
    upstream = chat_stream(*(f"line {i} of a long answer. " for i in range(20)), f"and then {MARKER}", "after")
    response = await post(engine, "chat", True, upstream, extra=WINDOWED)
    assert response.status_code == 200  # the stream had started: windows before the marker were released
    assert b"line 0 of" in response.content
    assert (
        MARKER.encode() not in response.content
        and b"SECRET" not in response.content
        and b"after" not in response.content
    )
    last = response.content.rstrip().rsplit(b"\n\n", 1)[-1]
    assert json.loads(last.removeprefix(b"data: "))["error"]["message"] == "The answer was withheld."


async def test_a_marker_split_across_a_window_edge_is_caught(engine: FakeEngine) -> None:
    # 40 characters fill the first window exactly with the marker's first half; the rest opens the next.
    lead = "a" * (40 - 5)
    upstream = chat_stream(lead + MARKER[:5], MARKER[5:] + " and more text after the secret to fill it.")
    response = await post(engine, "chat", True, upstream, extra=WINDOWED)
    assert response.status_code == 200 and MARKER[:5].encode() in response.content  # the first window passed
    assert MARKER[5:].encode() not in response.content, "the overlap read the marker whole"
    assert b'"error"' in response.content.rstrip().rsplit(b"\n\n", 1)[-1]


async def test_a_destructive_call_streamed_in_pieces_releases_none_of_them(engine: FakeEngine) -> None:
    args = json.dumps({"command": "rm -rf ~"})
    pieces = tuple(args[i : i + 3] for i in range(0, len(args), 3))
    upstream = chat_stream(*(f"step {i} of the plan is harmless. " for i in range(6)), calls=pieces)
    response = await post(engine, "chat", True, upstream, extra=WINDOWED)
    assert b"step 0" in response.content, "the text before the call was released"
    assert b"tool_calls" not in response.content and b"rm -rf" not in response.content
    assert b'"error"' in response.content


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_a_destructive_call_in_a_messages_or_responses_stream_is_held_and_blocked(engine: FakeEngine, api: str
                                                                                         ) -> None:  # fmt: skip
    response = await post(engine, api, True, answer(api, True, "Cleaning up. " * 10, command="rm -rf ~"),
                          extra=WINDOWED)  # fmt: skip
    assert b"rm -rf" not in response.content and b"shell" not in response.content


async def test_one_very_long_event_is_judged_whole(engine: FakeEngine) -> None:
    upstream = chat_stream("b" * 20_000 + MARKER + "b" * 100)
    response = await post(engine, "chat", True, upstream, extra=WINDOWED)
    assert response.status_code == 451 and MARKER.encode() not in response.content


async def test_windows_are_judged_while_the_next_fill() -> None:
    """Pipelining: a window's judgement starts before the one before it has its verdict."""
    in_flight, most = 0, 0

    async def slow(state: Any, questions: Any) -> dict[str, Any]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return verdicts(state, questions)

    engine = SlowEngine(slow)
    upstream = chat_stream(*(f"line {i} of a long and harmless answer. " for i in range(30)))
    response = await post(engine, "chat", True, upstream, extra=WINDOWED)
    assert response.content == upstream[0]
    assert most > 1, "windows were judged one after the other"


def test_an_answer_rule_reading_an_unknown_question_is_a_load_error() -> None:
    text = CONFIG.format(leak=BLOCK, extra="").replace("when: leak > 0.8", "when: secret > 0.8")
    with pytest.raises(ConfigError, match=r"policies\.guarded\.answer\.rules\[1\]\.when.*secret"):
        parse_config(text, "c.yaml")


def test_an_answer_rule_reading_a_request_fact_is_a_load_error() -> None:
    text = CONFIG.format(leak=BLOCK, extra="").replace("when: leak > 0.8", "when: leak > 0.8 and request.tokens > 9")
    with pytest.raises(ConfigError, match=r"answer rule 'no-leak' reads request\.tokens: an answer rule reads only"):
        parse_config(text, "c.yaml")


def test_an_answer_rule_blocks_or_replaces_not_both() -> None:
    with pytest.raises(ConfigError, match=r"either blocks or replaces, not both"):
        parse_config(CONFIG.format(leak=BLOCK + ", replace: no", extra=""), "c.yaml")


# --- the middleware: the app's own answer judged -----------------------------------------------------------------
def app_answering(body: bytes, kind: str, *, gzipped: bool = False, status: int = 200) -> Any:
    """A Starlette app answering every POST with `body` (an event stream in three parts, as an app streams it)."""

    async def answer_it(request: Request) -> Response:
        if kind == "text/event-stream":
            thirds = [body[: len(body) // 3], body[len(body) // 3 : 2 * len(body) // 3], body[2 * len(body) // 3 :]]

            async def parts() -> AsyncIterator[bytes]:
                for part in thirds:
                    yield part

            return StreamingResponse(parts(), media_type=kind, status_code=status)
        return Response(body, media_type=kind, status_code=status)

    inner: Any = Starlette(routes=[Route(path, answer_it, methods=["POST"]) for path in PATHS.values()])
    return GZipMiddleware(inner, minimum_size=10) if gzipped else inner


async def through_middleware(engine: FakeEngine, inner: Any, api: str, stream: bool, extra: str = "") -> httpx.Response:
    config = parse_config(CONFIG.format(leak=BLOCK, extra=extra), "c.yaml")
    app = D3RouterMiddleware(inner, config=config, engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        return await http.post(PATHS[api], json=request(api, stream), headers={"accept-encoding": "gzip"})


@pytest.mark.parametrize(("api", "stream"), CASES)
async def test_the_middleware_withholds_the_apps_answer_with_the_marker(engine: FakeEngine, api: str, stream: bool
                                                                        ) -> None:  # fmt: skip
    body, kind = answer(api, stream, f"The code is {MARKER}.")
    response = await through_middleware(engine, app_answering(body, kind), api, stream)
    assert response.status_code == 451 and MARKER.encode() not in response.content


@pytest.mark.parametrize(("api", "stream"), CASES)
async def test_the_middleware_passes_a_clean_answer_byte_for_byte(engine: FakeEngine, api: str, stream: bool) -> None:
    body, kind = answer(api, stream, "Nothing of note.")
    response = await through_middleware(engine, app_answering(body, kind), api, stream)
    assert response.status_code == 200 and response.content == body


async def test_the_middleware_judges_an_app_answer_gzipped_inside_it(engine: FakeEngine) -> None:
    body, kind = answer("chat", False, f"The code is {MARKER}, said at length to be worth compressing.")
    response = await through_middleware(engine, app_answering(body, kind, gzipped=True), "chat", False)
    assert response.status_code == 451


async def test_the_middleware_lets_an_apps_error_through_unjudged(engine: FakeEngine) -> None:
    response = await through_middleware(engine, app_answering(b'{"error": "x"}', "application/json", status=500),
                                        "chat", False)  # fmt: skip
    assert response.status_code == 500 and response.content == b'{"error": "x"}'
    assert engine.calls == [], "the request policy asks nothing here, and an error answer is not judged"


async def test_the_middleware_refuses_an_app_answer_over_the_bound(engine: FakeEngine) -> None:
    body, kind = answer("chat", True, "z" * 3000)
    response = await through_middleware(engine, app_answering(body, kind), "chat", True, extra="max_answer_bytes: 1000")
    assert response.status_code == 502 and b"zzz" not in response.content


def test_check_summarizes_the_answer_guard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(leak=BLOCK, extra="read: tool_calls"), encoding="utf-8")
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "    answer guard: reads tool_calls, asks 2 (leak, destructive), 2 rules; on engine error: block"
    )


@pytest.mark.parametrize(("stream", "text", "outcome"), [
    (False, "Nothing here.", ("-", "pass")), (False, MARKER, ("no-leak", "block")),
    (True, "Nothing here.", ("-", "pass")), (True, MARKER, ("no-leak", "block")),
])  # fmt: skip
async def test_verdicts_and_judgements_are_counted(engine: FakeEngine, stream: bool, text: str, outcome: tuple[str, str]
                                                   ) -> None:  # fmt: skip
    config = parse_config(CONFIG.format(leak=BLOCK, extra=""), "c.yaml")
    app = create_app(config, engine=engine, transport=httpx.AsyncHTTPTransport())
    body, kind = answer("chat", stream, text)
    with respx.mock(assert_all_called=True) as mock:
        mock.route(host="up.test").mock(return_value=httpx.Response(200, content=body, headers={"content-type": kind}))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            await http.post(PATHS["chat"], json=request("chat", stream))
    shown = app.service.metrics.render()
    await app.aclose()
    rule, result = outcome
    assert f'd3router_answer_verdicts_total{{outcome="{result}",policy="guarded",rule="{rule}"}} 1.0' in shown
    assert 'd3router_answer_judgements_total{policy="guarded"} 1.0' in shown


async def test_the_middleware_judges_an_apps_stream_in_windows(engine: FakeEngine) -> None:
    body, kind = chat_stream(*(f"line {i} of a long answer. " for i in range(20)), f"and then {MARKER}", "after")
    response = await through_middleware(engine, app_answering(body, kind), "chat", True, extra=WINDOWED)
    assert response.status_code == 200 and b"line 0 of" in response.content  # released window by window
    assert MARKER.encode() not in response.content and b"after" not in response.content
    last = response.content.rstrip().rsplit(b"\n\n", 1)[-1]
    assert json.loads(last.removeprefix(b"data: "))["error"]["message"] == "The answer was withheld."
    assert len(engine.calls) > 3


async def test_the_middleware_passes_a_long_clean_stream_whole_in_windows(engine: FakeEngine) -> None:
    body, kind = chat_stream(*(f"line {i} of a long and harmless answer. " for i in range(30)))
    response = await through_middleware(engine, app_answering(body, kind), "chat", True, extra=WINDOWED)
    assert response.status_code == 200 and response.content == body
    assert len(engine.calls) > 10


async def test_a_tool_call_that_never_ends_is_not_held_past_the_bound(engine: FakeEngine) -> None:
    pieces = tuple('{"command": "' + "x" * 200 for _ in range(20))
    upstream = chat_stream(calls=pieces)
    upstream = (upstream[0].replace(b'"finish_reason": "stop"', b'"finish_reason": null'), upstream[1])
    response = await post(engine, "chat", True, upstream, extra=WINDOWED + "\n      max_answer_bytes: 2000")
    assert response.status_code == 502 and b"xxxx" not in response.content


ANSWER_TESTS = """
      tests:
        - {{answers: {{destructive: 0.95}}, expect: {{rule: no-destruction, outcome: block, status: 403}}}}
        - {{answers: {{destructive: 0.1, leak: 0.9}}, expect: {{rule: no-leak, outcome: {outcome}}}}}
        - {{engine_error: true, expect: {{outcome: block, status: 503, degraded: true}}}}
"""


@pytest.mark.parametrize(("outcome", "code", "line"), [
    ("block", 0, "PASS {file}:{n} guarded answer #2"),
    ("pass", 1, "FAIL {file}:{n} guarded answer #2: expected pass, got block; trace: no-destruction (missed), no-leak"),
])  # fmt: skip
def test_d3router_test_runs_the_answer_guards_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str], outcome: str,
                                                    code: int, line: str) -> None:  # fmt: skip
    path = tmp_path / "router.yaml"
    text = CONFIG.format(leak=BLOCK, extra="") + ANSWER_TESTS.format(outcome=outcome)
    path.write_text(text, encoding="utf-8")
    assert main(["test", str(path)]) == code
    out = capsys.readouterr().out.splitlines()
    number = text.splitlines().index(next(t for t in text.splitlines() if "leak: 0.9" in t)) + 1
    assert line.format(file=path, n=number) in out
    assert out[-1] == f"policy tests: {3 - code} passed, {code} failed"


def test_an_answer_case_naming_an_unknown_question_is_a_load_error() -> None:
    text = CONFIG.format(leak=BLOCK, extra="") + ANSWER_TESTS.format(outcome="block").replace("leak: 0.9", "lek: 0.9")
    with pytest.raises(ConfigError, match=r"answer\.tests\[1\]\.answers\.lek: unknown answer question 'lek'"):
        parse_config(text, "c.yaml")


@pytest.mark.parametrize("api", list(PATHS))
def test_a_whole_stream_reads_as_its_text_and_tool_calls(api: str) -> None:
    """A stream read whole (a content-coded stream of the middleware's app) reads as the windows follow it."""
    body, _ = answer(api, True, f"it is {MARKER}", command=None if api == "completions" else "rm -rf ~")
    read = read_answer(api, body, streamed=True)
    assert read.text == f"it is {MARKER}"
    calls = [] if api == "completions" else [Call("shell", json.dumps({"command": "rm -rf ~"}))]
    assert read.calls == calls
