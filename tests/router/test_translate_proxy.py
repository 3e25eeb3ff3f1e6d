"""Routes to an upstream of another API through the proxy (issue 30.2): the `anthropic` SDK to a chat-only upstream,
the `openai` SDK to a Messages-only one (RESPX fakes answering in their own API's shapes), whole and streamed, errors
in the client's shape, the upstream's path and key header, losses named in a header and a metric; the routes
`d3router check` refuses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import respx

from d3backend import FakeEngine
from policies import ConfigError, parse_config
from router import ProxyApp, create_app
from router._translate.base import UNSIGNED, sse
from tests.router import _sdk_shapes as sdk
from tests.router._peers import WEATHER, chat_reply, proxy_clients

pytestmark = pytest.mark.anyio

CONFIG = """
server: {default_policy: tochat, expose_decisions: true}
upstreams:
  chatup: {url: http://chat.test/v1, model: qwen, api: chat, api_key_env: CHAT_KEY}
  msgup: {url: http://msg.test/v1, model: claude-x, api: messages, api_key_env: MSG_KEY}
  ownkey: {url: http://chat.test/v1, model: qwen, api: chat, forward_client_key: true}
  native: {url: http://msg.test/v1, model: claude-x}
policies:
  tochat:
    apis: [messages, chat]
    rules: [{name: default, route: chatup}]
  tomsg:
    apis: [chat, messages]
    rules: [{name: default, route: msgup}]
  native:
    apis: [messages]
    rules: [{name: default, route: native}]
  ownkey:
    apis: [messages]
    rules: [{name: default, route: ownkey}]
  guarded:
    apis: [messages]
    rules: [{name: default, route: chatup}]
    answer:
      read: tool_calls
      questions: {destructive: {type: noul, instructions: Does a tool call delete files?}}
      rules: [{name: no-rm, when: destructive > 0.8, block: {status: 403, message: That command was refused.}}]
"""
TOOLS = [{"name": "weather", "description": "The weather", "input_schema": {"type": "object",
          "properties": {"city": {"type": "string"}}, "required": ["city"]}}]  # fmt: skip
seen: list[httpx.Request] = []


def chat_upstream(request: httpx.Request) -> httpx.Response:
    """A chat-only fake: what it is sent is checked by the openai SDK's request types."""
    seen.append(request)
    body = json.loads(request.content)
    sdk.chat_request(body)
    if body["messages"][-1]["content"] == "garbage":
        return httpx.Response(200, content=b"<html>oops</html>", headers={"content-type": "text/html"})
    if body["messages"][-1]["content"] == "fail":
        return httpx.Response(429, json={"error": {"message": "slow down", "type": "rate_limit"}})
    stream = bool(body.get("stream"))
    if body["messages"][-1]["content"] == "clean up":  # a destructive command, streamed in one piece
        return chat_reply(stream, ("call_2" if stream else "call_1", "Bash", '{"command": "rm -rf /"}'), split=False)
    asks_tool = body["messages"][-1]["role"] == "user" and "tools" in body
    return chat_reply(stream, ("call_1", "weather", WEATHER) if asks_tool else None)


MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
           "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "Hi!"}],
           "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 2}}  # fmt: skip


def messages_upstream(request: httpx.Request) -> httpx.Response:
    """A Messages-only fake: what it is sent is checked by the anthropic SDK's request types."""
    seen.append(request)
    body = json.loads(request.content)
    sdk.messages_request(body)  # raises (a 500 here, a failed test there) on a body the SDK would not send
    if json.dumps(body["messages"][-1]["content"]) in ('"fail"', '[{"type": "text", "text": "fail"}]'):
        return httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    if body.get("stream"):
        events: list[dict[str, Any]] = [{"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}},
                  {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi!"}},
                  {"type": "content_block_stop", "index": 0},
                  {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                   "usage": {"output_tokens": 2}},
                  {"type": "message_stop"}]  # fmt: skip
        data = b"".join(sse(event, event["type"]) for event in events)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)
    return httpx.Response(200, json=MESSAGE)


def verdicts(state: Any, questions: Any) -> dict[str, Any]:
    return {"destructive": 0.99 if "rm -rf" in json.dumps(state) else 0.01} if "destructive" in questions else {}


@pytest.fixture
async def app() -> AsyncIterator[ProxyApp]:
    seen.clear()
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="chat.test").mock(side_effect=chat_upstream)
        mock.route(host="msg.test").mock(side_effect=messages_upstream)
        proxy = create_app(parse_config(CONFIG, "c.yaml"), engine=FakeEngine(verdicts),
                           transport=httpx.AsyncHTTPTransport(), environ={"CHAT_KEY": "sk-chat", "MSG_KEY": "sk-msg"})  # fmt: skip
        yield proxy
        await proxy.aclose()


http, claude, gpt = proxy_clients()  # of `app`, in process


async def test_the_anthropic_sdk_calls_a_tool_and_reads_the_result_through_a_chat_upstream(
    claude: anthropic.AsyncAnthropic,
) -> None:
    client = claude
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    first = await client.messages.create(model="tochat", max_tokens=64, messages=asked, tools=TOOLS)  # type: ignore[arg-type]
    call = first.content[0]
    assert first.stop_reason == "tool_use" and call.type == "tool_use" and call.input == {"city": "Oslo"}
    assert first.model == "tochat"  # the answer names the model asked for, translated or not (issue 26.1)
    upstream = seen[-1]
    assert (upstream.url.path, upstream.headers["authorization"]) == ("/v1/chat/completions", "Bearer sk-chat")
    assert "x-api-key" not in upstream.headers
    result = [*asked, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Rain"}]}]  # fmt: skip
    second = await client.messages.create(model="tochat", max_tokens=64, messages=result, tools=TOOLS)  # type: ignore[arg-type]
    assert second.content[0].type == "text" and second.content[0].text == "Rainy in Oslo."
    sent = json.loads(seen[-1].content)["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "Rain"}
    assert (second.usage.input_tokens, second.usage.output_tokens) == (9, 4)


async def test_the_anthropic_sdk_streams_through_a_chat_upstream(claude: anthropic.AsyncAnthropic) -> None:
    client = claude
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    async with client.messages.stream(model="tochat", max_tokens=64, messages=asked, tools=TOOLS) as stream:  # type: ignore[arg-type]
        kinds = [event.type async for event in stream]
        message = await stream.get_final_message()
    assert kinds[0] == "message_start" and "input_json" in kinds and kinds[-1] == "message_stop"
    assert message.content[0].type == "tool_use" and message.content[0].input == {"city": "Oslo"}
    assert message.stop_reason == "tool_use" and message.usage.output_tokens == 4
    sent = json.loads(seen[-1].content)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_losses_are_named_in_a_header_and_counted(app: ProxyApp, http: httpx.AsyncClient) -> None:
    body = {"model": "tochat", "max_tokens": 9, "top_k": 3, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"},
                                          {"type": "text", "text": "yo"}]},
        {"role": "user", "content": "again"}]}  # fmt: skip
    response = await http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-d3-translation-losses"] == "thinking_dropped,thinking_signature_dropped,top_k_dropped"
    assert b'"s"' not in seen[-1].content
    metrics = (await http.get("/metrics")).text
    assert ('d3router_translation_losses_total{client="messages",loss="thinking_signature_dropped",'
            'upstream="chat"} 1.0') in metrics  # fmt: skip
    plain = await http.post("/v1/messages", json={"model": "tochat", "max_tokens": 9,
                                                  "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert "x-d3-translation-losses" not in plain.headers


async def test_an_upstream_error_is_raised_by_the_sdk_in_its_own_shape(
    claude: anthropic.AsyncAnthropic, gpt: openai.AsyncOpenAI
) -> None:
    with pytest.raises(anthropic.RateLimitError, match="slow down"):
        await claude.messages.create(model="tochat", max_tokens=9, messages=[{"role": "user", "content": "fail"}])
    with pytest.raises(openai.APIStatusError, match="busy") as raised:
        await gpt.chat.completions.create(model="tomsg", messages=[{"role": "user", "content": "fail"}])
    assert raised.value.status_code == 529


async def test_the_openai_sdk_through_a_messages_upstream(http: httpx.AsyncClient, gpt: openai.AsyncOpenAI) -> None:
    answer = await gpt.chat.completions.create(model="tomsg", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hi!" and answer.choices[0].finish_reason == "stop"
    upstream = seen[-1]
    assert upstream.url.path == "/v1/messages"
    assert (upstream.headers["x-api-key"], upstream.headers["anthropic-version"]) == ("sk-msg", "2023-06-01")
    assert "authorization" not in upstream.headers
    raw = await http.post(
        "/v1/chat/completions", json={"model": "tomsg", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert raw.headers["x-d3-translation-losses"] == "thinking_signature_dropped"
    stream = await gpt.chat.completions.create(model="tomsg", messages=[{"role": "user", "content": "hi"}],
                                               stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi!"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


def test_check_refuses_a_route_no_translation_carries() -> None:
    refused = CONFIG.replace("apis: [chat, messages]", "apis: [chat, messages, completions]")
    with pytest.raises(ConfigError, match=r"upstream 'msgup' speaks the Anthropic Messages .* no translation carries"
                                          r" the Completions .* `apis: \[chat, messages\]`"):  # fmt: skip
        parse_config(refused, "c.yaml")
    lossy = CONFIG.replace("route: msgup}", "route: msgup, set: {seed: 3}}")
    with pytest.raises(ConfigError, match=r"`set` 'seed' has no equivalent in the Anthropic Messages .* 'msgup'"):
        parse_config(lossy, "c.yaml")


async def test_count_tokens_through_a_translated_route_is_the_routers_estimate(
    claude: anthropic.AsyncAnthropic,
) -> None:
    counted = await claude.messages.count_tokens(model="tochat", messages=[{"role": "user", "content": "x" * 40}])
    assert counted.input_tokens == 10
    assert seen == []  # a chat upstream has no Messages count endpoint: never asked


async def test_an_answer_guard_judges_the_translated_answer(claude: anthropic.AsyncAnthropic) -> None:
    """The guard reads the answer in the client's API (here Messages' tool_use), whole and streamed: the chat
    upstream's `rm -rf` call never reaches the client."""
    asked: Any = [{"role": "user", "content": "clean up"}]
    with pytest.raises(anthropic.PermissionDeniedError, match=r"That command was refused\."):
        await claude.messages.create(model="guarded", max_tokens=9, messages=asked)
    with pytest.raises(anthropic.PermissionDeniedError, match=r"That command was refused\."):
        async with claude.messages.stream(model="guarded", max_tokens=9, messages=asked) as stream:
            [event async for event in stream]
    fine = await claude.messages.create(model="guarded", max_tokens=9, messages=[{"role": "user", "content": "hi"}])
    assert fine.content[0].type == "text"


async def test_an_answer_that_is_not_json_is_a_502_in_the_clients_shape(claude: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.APIStatusError, match="not JSON") as raised:
        await claude.messages.create(model="tochat", max_tokens=9, messages=[{"role": "user", "content": "garbage"}])
    assert raised.value.status_code == 502


async def test_a_forwarded_client_key_goes_in_the_upstream_apis_header(claude: anthropic.AsyncAnthropic) -> None:
    await claude.messages.create(model="ownkey", max_tokens=9, messages=[{"role": "user", "content": "hi"}])
    headers = seen[-1].headers
    assert headers["authorization"] == "Bearer sk-agent" and "x-api-key" not in headers


async def test_thinking_the_router_made_is_never_sent_to_an_anthropic_upstream(
    claude: anthropic.AsyncAnthropic, http: httpx.AsyncClient
) -> None:
    """A turn answered by a chat upstream carries thinking the router made (its signature marks it); a later turn
    that goes to a Messages upstream natively sends it back: it is left out there, named, and a real one is kept."""
    first = await claude.messages.create(model="tochat", max_tokens=9, messages=[{"role": "user", "content": "hi"}])
    made = {"type": "thinking", "thinking": "the chat model's reasoning", "signature": UNSIGNED}
    real = {"type": "thinking", "thinking": "Claude's own", "signature": "c2ln"}
    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": [made, *(b.model_dump() for b in first.content)]},
             {"role": "user", "content": "and?"}, {"role": "assistant", "content": [real, {"type": "text", "text": "so"}]},
             {"role": "user", "content": "more"}]  # fmt: skip
    response = await http.post("/v1/messages", json={"model": "native", "max_tokens": 9, "messages": turns})
    assert response.status_code == 200, response.text
    assert response.headers["x-d3-translation-losses"] == "unsigned_thinking_dropped"
    sent = json.loads(seen[-1].content)["messages"]
    assert UNSIGNED.encode() not in seen[-1].content
    assert sent[3]["content"][0] == real
