"""Custom tools through the proxy's Responses -> chat route (issue 30.1): the `openai` SDK's Responses API with a
custom tool, streamed, to a chat-only upstream (a RESPX fake) that gets it as a function tool and answers a function
call, which the SDK's stream accumulator reads as a `custom_tool_call`; `upstreams.NAME.custom_tools: native` keeps
chat's custom tools for an upstream that takes them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import ProxyApp, create_app

pytestmark = pytest.mark.anyio

CONFIG = """
server: {default_policy: fn}
upstreams:
  plain: {url: http://plain.test/v1, model: qwen, api: chat}
  openai: {url: http://openai.test/v1, model: gpt, api: chat, custom_tools: native}
policies:
  fn: {apis: [responses], rules: [{name: default, route: plain}]}
  nat: {apis: [responses], rules: [{name: default, route: openai}]}
"""
TOOL: Any = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'}}  # fmt: skip
PATCH = "*** Begin Patch\n+hi\n*** End Patch\n"
seen: list[dict[str, Any]] = []


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def upstream(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    seen.append(body)
    tool = body["tools"][0]
    if not body.get("stream"):
        call = ({"id": "call_1", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
                if tool["type"] == "custom" else {"id": "call_1", "type": "function",
                "function": {"name": "apply_patch", "arguments": json.dumps({"input": PATCH})}})  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                  "finish_reason": "tool_calls"}  # fmt: skip
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "created": 1, "model": "up",
                                         "choices": [choice]})  # fmt: skip
    if tool["type"] == "custom":
        first = {"index": 0, "id": "call_1", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
        rest = b""
    else:
        arguments = json.dumps({"input": PATCH})
        first = {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "apply_patch", "arguments": arguments[:12]}}  # fmt: skip
        rest = _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[12:]}}]})
    data = _chunk({"tool_calls": [first]}) + rest + _chunk({}, "tool_calls") + b"data: [DONE]\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)


@pytest.fixture
async def gpt() -> AsyncIterator[openai.AsyncOpenAI]:
    seen.clear()
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="plain.test").mock(side_effect=upstream)
        mock.route(host="openai.test").mock(side_effect=upstream)
        proxy: ProxyApp = create_app(parse_config(CONFIG, "c.yaml"), engine=FakeEngine(lambda state, questions: {}),
                                     transport=httpx.AsyncHTTPTransport(), environ={})  # fmt: skip
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://router") as http:
            yield openai.AsyncOpenAI(api_key="k", base_url="http://router/v1", http_client=http, max_retries=0)
        await proxy.aclose()


@pytest.mark.parametrize(("policy", "sent"), [("fn", "function"), ("nat", "custom")])
async def test_a_custom_tool_through_a_chat_upstream(gpt: openai.AsyncOpenAI, policy: str, sent: str) -> None:
    async with gpt.responses.stream(model=policy, input="Patch it.", tools=[TOOL]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert seen[-1]["tools"][0]["type"] == sent
    call = final.output[0]
    assert call.type == "custom_tool_call" and (call.call_id, call.name, call.input) == ("call_1", "apply_patch", PATCH)
    assert "response.custom_tool_call_input.delta" in kinds and kinds[-1] == "response.completed"
    raw = await gpt.responses.with_raw_response.create(model=policy, input="Patch it.", tools=[TOOL])
    whole = raw.parse().output[0]
    assert whole.type == "custom_tool_call" and whole.input == PATCH
    named = raw.headers.get("x-d3-translation-losses", "")
    assert ("custom_tool_as_function" in named) == (policy == "fn")
