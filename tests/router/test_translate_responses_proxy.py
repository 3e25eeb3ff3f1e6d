"""The Responses API and Chat Completions through the proxy's translated routes (issue 30.1, 30.2): the `openai` SDK's
Responses API to a chat-only upstream and its chat API to a Responses-only one (RESPX fakes answering in their own
API's shapes), whole and streamed, a function tool and its output, errors in the client's shape, the refused
`previous_response_id`, losses in the header."""

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
from router._translate.base import sse
from tests.router._peers import WEATHER, chat_reply

pytestmark = pytest.mark.anyio

CONFIG = """
server: {default_policy: tochat, expose_decisions: true}
upstreams:
  chatup: {url: http://chat.test/v1, model: qwen, api: chat, api_key_env: CHAT_KEY}
  respup: {url: http://resp.test/v1, model: gpt-x, api: responses, api_key_env: RESP_KEY}
policies:
  tochat:
    apis: [responses]
    rules: [{name: default, route: chatup}]
  toresp:
    apis: [chat]
    rules: [{name: default, route: respup}]
"""
TOOL = {"type": "function", "name": "weather", "description": "The weather", "strict": False,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
seen: list[httpx.Request] = []


def chat_upstream(request: httpx.Request) -> httpx.Response:
    seen.append(request)
    body = json.loads(request.content)
    last = body["messages"][-1]
    if last["content"] == "fail":
        return httpx.Response(429, json={"error": {"message": "slow down", "type": "rate_limit_error"}})
    calls = last["role"] == "user" and "tools" in body
    return chat_reply(bool(body.get("stream")), ("call_1", "weather", WEATHER) if calls else None)


RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-x", "status": "completed",
            "output": [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "SECRET"},
                       {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}  # fmt: skip


def responses_upstream(request: httpx.Request) -> httpx.Response:
    seen.append(request)
    body = json.loads(request.content)
    if body["input"][-1]["content"] == "fail":
        return httpx.Response(503, json={"error": {"message": "busy", "type": "server_error"}})
    if body.get("stream"):
        message = RESPONSE["output"][1]  # type: ignore[index]
        events = [{"type": "response.created", "response": {**RESPONSE, "status": "in_progress", "output": []}},
                  {"type": "response.output_item.added", "output_index": 0, "item": {**message, "content": []}},
                  {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": "msg_1",
                   "delta": "Hi"},
                  {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": "msg_1",
                   "delta": "!"},
                  {"type": "response.output_item.done", "output_index": 0, "item": message},
                  {"type": "response.completed", "response": RESPONSE}]  # fmt: skip
        data = b"".join(sse(event, event["type"]) for event in events)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)
    return httpx.Response(200, json=RESPONSE)


@pytest.fixture
async def gpt() -> AsyncIterator[openai.AsyncOpenAI]:
    """The real `openai` SDK against the router in process."""
    seen.clear()
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="chat.test").mock(side_effect=chat_upstream)
        mock.route(host="resp.test").mock(side_effect=responses_upstream)
        proxy: ProxyApp = create_app(parse_config(CONFIG, "c.yaml"), engine=FakeEngine(lambda state, questions: {}),
                                     transport=httpx.AsyncHTTPTransport(),
                                     environ={"CHAT_KEY": "sk-chat", "RESP_KEY": "sk-resp"})  # fmt: skip
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://router") as http:
            yield openai.AsyncOpenAI(api_key="k", base_url="http://router/v1", http_client=http, max_retries=0)
        await proxy.aclose()


async def test_the_responses_api_calls_a_tool_and_reads_its_output_through_a_chat_upstream(
    gpt: openai.AsyncOpenAI,
) -> None:
    asked: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    raw = await gpt.responses.with_raw_response.create(model="tochat", instructions="Be brief.", input=asked,
                                                       tools=[TOOL], store=False)  # type: ignore[list-item]  # fmt: skip
    first = raw.parse()
    call = first.output[0]
    assert call.type == "function_call" and (call.call_id, call.name) == ("call_1", "weather")
    assert json.loads(call.arguments) == {"city": "Oslo"} and first.model == "tochat"
    assert "x-d3-translation-losses" not in raw.headers
    upstream = seen[-1]
    assert (upstream.url.path, upstream.headers["authorization"]) == ("/v1/chat/completions", "Bearer sk-chat")
    assert json.loads(upstream.content)["messages"][0] == {"role": "system", "content": "Be brief."}
    result = [*asked, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "Rain"}]  # fmt: skip
    second = await gpt.responses.create(model="tochat", input=result, tools=[TOOL])  # type: ignore[list-item]
    assert second.output_text == "Rainy in Oslo." and second.status == "completed"
    sent = json.loads(seen[-1].content)["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_1"
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "Rain"}
    assert second.usage is not None and (second.usage.input_tokens, second.usage.output_tokens) == (9, 4)


async def test_the_responses_api_streams_through_a_chat_upstream(gpt: openai.AsyncOpenAI) -> None:
    async with gpt.responses.stream(model="tochat", input="Weather in Oslo?", tools=[TOOL]) as stream:  # type: ignore[list-item]
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    call = final.output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo"}
    assert final.usage is not None and final.usage.output_tokens == 4
    sent = json.loads(seen[-1].content)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    async with gpt.responses.stream(model="tochat", input=[{"role": "user", "content": "hi"}]) as stream:
        texts = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert texts == ["Rainy", " in Oslo."] and final.output_text == "Rainy in Oslo."


async def test_losses_named_and_server_state_refused(gpt: openai.AsyncOpenAI) -> None:
    raw = await gpt.responses.with_raw_response.create(model="tochat", input="hi", tools=[{"type": "web_search"}],
                                                       store=True)  # fmt: skip
    assert raw.headers["x-d3-translation-losses"] == "web_search_tool_dropped,store_dropped"
    with pytest.raises(openai.BadRequestError, match="previous_response_id cannot be carried") as refused:
        await gpt.responses.create(model="tochat", input="and then?", previous_response_id="resp_0")
    assert refused.value.param == "previous_response_id"
    with pytest.raises(openai.RateLimitError, match="slow down"):
        await gpt.responses.create(model="tochat", input="fail")


async def test_the_chat_api_through_a_responses_upstream(gpt: openai.AsyncOpenAI) -> None:
    raw = await gpt.chat.completions.with_raw_response.create(
        model="toresp", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        stop=["\n"])  # fmt: skip
    answer = raw.parse()
    assert answer.choices[0].message.content == "Hi!" and answer.choices[0].finish_reason == "stop"
    assert answer.model == "toresp" and answer.usage is not None and answer.usage.total_tokens == 7
    assert raw.headers["x-d3-translation-losses"] == "stop_dropped,reasoning_encrypted_content_dropped"
    upstream = seen[-1]
    assert (upstream.url.path, upstream.headers["authorization"]) == ("/v1/responses", "Bearer sk-resp")
    body = json.loads(upstream.content)
    assert (body["instructions"], body["store"], body["model"]) == ("Be brief.", False, "gpt-x")
    stream = await gpt.chat.completions.create(model="toresp", messages=[{"role": "user", "content": "hi"}],
                                               stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi!"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
    with pytest.raises(openai.InternalServerError, match="busy"):
        await gpt.chat.completions.create(model="toresp", messages=[{"role": "user", "content": "fail"}])
