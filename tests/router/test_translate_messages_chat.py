"""Messages <-> Chat Completions translation (issue 30.3), the shapes checked by the real SDKs' types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router._translate.base import UNSIGNED, SseEvent, SseReader
from router._translate.chat_messages import ChatOverMessages
from router._translate.messages_chat import MessagesOverChat, effort
from router._translate.registry import Composed, pairs, translation
from tests.router import _sdk_shapes as sdk

PNG = "iVBORw0KGgo="

CONVERSATION: dict[str, Any] = {
    "model": "auto",
    "max_tokens": 512,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture, and what is the weather?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants the weather.", "signature": "c2lnbmVk"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "Sunny, 21C"}]},
            {"type": "text", "text": "Thanks. Summarise."},
        ]},
    ],
    "tools": [{"name": "weather", "description": "The weather in a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "temperature": 0.2, "top_p": 0.9, "top_k": 40,
    "stop_sequences": ["END"],
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "metadata": {"user_id": "user-7"},
}  # fmt: skip


def test_a_messages_request_becomes_a_chat_request_the_openai_sdk_accepts() -> None:
    body, lost = MessagesOverChat().request(CONVERSATION)
    checked = sdk.chat_request(body)
    assert checked["messages"][0] == {"role": "system", "content": "You are terse."}
    user = checked["messages"][1]
    assert user["content"][1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assistant = checked["messages"][2]
    assert assistant["content"] == "Let me look."
    assert assistant["tool_calls"] == [{"id": "toolu_01", "type": "function",
                                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]  # fmt: skip
    # The tool result answers its call by id, right after the call, before the user's own words.
    assert checked["messages"][3] == {"role": "tool", "tool_call_id": "toolu_01", "content": "Sunny, 21C"}
    assert checked["messages"][4] == {"role": "user", "content": "Thanks. Summarise."}
    assert checked["tools"][0]["function"]["parameters"]["properties"] == {"city": {"type": "string"}}
    assert (checked["tool_choice"], checked["parallel_tool_calls"]) == ("auto", False)
    assert (checked["stop"], checked["user"], checked["reasoning_effort"]) == (["END"], "user-7", "low")
    assert (checked["max_tokens"], checked["temperature"], checked["top_p"]) == (512, 0.2, 0.9)
    # Never a thinking signature to a model that did not make it; each loss named.
    assert "c2lnbmVk" not in json.dumps(body) and "The user wants" not in json.dumps(body)
    assert sorted(lost) == ["cache_control_dropped", "thinking_dropped", "thinking_signature_dropped",
                            "top_k_dropped"]  # fmt: skip


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "weather"}, {"type": "function", "function": {"name": "weather"}}),
])  # fmt: skip
def test_tool_choice_is_carried(choice: dict[str, Any], expected: Any) -> None:
    body, _ = MessagesOverChat().request({**CONVERSATION, "tool_choice": choice})
    assert sdk.chat_request(body)["tool_choice"] == expected


@pytest.mark.parametrize(("budget", "expected"), [(1024, "low"), (4096, "low"), (8000, "medium"), (32000, "high")])
def test_a_thinking_budget_is_a_reasoning_effort(budget: int, expected: str) -> None:
    assert effort(budget) == expected
    body, _ = MessagesOverChat().request({**CONVERSATION, "thinking": {"type": "enabled", "budget_tokens": budget}})
    assert body["reasoning_effort"] == expected


def test_messages_effort_and_output_format_are_carried() -> None:
    schema = {"type": "object"}
    config = {"effort": "max", "format": {"type": "json_schema", "schema": schema}}
    body, _ = MessagesOverChat().request({**CONVERSATION, "thinking": {"type": "adaptive"}, "output_config": config})
    checked = sdk.chat_request(body)
    assert checked["reasoning_effort"] == "max"
    assert checked["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def test_what_chat_cannot_hold_is_named() -> None:
    body = {"model": "m", "max_tokens": 9, "service_tier": "auto", "messages": [
        {"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
            {"type": "tool_result", "tool_use_id": "t", "is_error": True, "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xyz"}]},
    ], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}  # fmt: skip
    out, lost = MessagesOverChat().request(body)
    sdk.chat_request(out)
    assert "tools" not in out
    assert sorted(lost) == ["document_dropped", "redacted_thinking_dropped", "server_tool_dropped",
                            "service_tier_dropped", "tool_result_image_dropped", "tool_result_is_error_dropped"]  # fmt: skip


COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "qwen",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Looking it up.", "reasoning_content": "Need the tool.",
        "tool_calls": [{"id": "call_9", "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
              "prompt_tokens_details": {"cached_tokens": 10}},
}  # fmt: skip


def test_a_chat_answer_becomes_a_message_the_anthropic_sdk_reads() -> None:
    answer, lost = MessagesOverChat().answer(COMPLETION)
    message = sdk.message(answer)
    assert lost == []
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].type == "thinking" and message.content[0].signature == UNSIGNED  # made by no model
    call = message.content[2]
    assert call.type == "tool_use" and (call.id, call.name, call.input) == ("call_9", "weather", {"city": "Oslo"})
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens) == (
        20, 12, 10)  # fmt: skip


@pytest.mark.parametrize(("finish", "matched", "reason", "sequence"), [
    ("stop", None, "end_turn", None), ("length", None, "max_tokens", None), ("stop", "END", "stop_sequence", "END"),
    ("content_filter", None, "refusal", None),
])  # fmt: skip
def test_finish_reasons_are_stop_reasons(finish: str, matched: str | None, reason: str, sequence: str | None) -> None:
    tr = MessagesOverChat()
    tr.request({**CONVERSATION, "stop_sequences": ["END"]})
    choice = {"index": 0, "finish_reason": finish, "stop_reason": matched,
              "message": {"role": "assistant", "content": "hi"}}  # fmt: skip
    message = sdk.message(tr.answer({**COMPLETION, "choices": [choice]})[0])
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "qwen",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}  # fmt: skip


STREAM = sdk.chunks_of(
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning_content": "Need "}), _chunk({"reasoning_content": "the tool."}),
    _chunk({"content": "Looking "}), _chunk({"content": "it up."}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                            "function": {"name": "weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "call_10", "type": "function",
                            "function": {"name": "clock", "arguments": "{}"}}]}),
    _chunk({}, "tool_calls"),
    {**_chunk({}), "choices": [], "usage": COMPLETION["usage"]},
)  # fmt: skip


@pytest.mark.parametrize("size", [len(STREAM), 7, 1])
def test_a_chat_stream_becomes_messages_events_the_anthropic_sdk_accumulates(size: int) -> None:
    stream = MessagesOverChat().stream()
    out = b"".join(stream.feed(piece) for piece in sdk.pieces(STREAM, size)) + stream.flush()
    message = sdk.messages_stream(out)
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[0].type == "thinking" and message.content[0].thinking == "Need the tool."
    assert message.content[0].signature == UNSIGNED
    assert message.content[1].type == "text" and message.content[1].text == "Looking it up."
    calls = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert calls == [("call_9", "weather", {"city": "Oslo"}), ("call_10", "clock", {})]
    assert (message.stop_reason, message.usage.output_tokens, message.usage.input_tokens) == ("tool_use", 12, 20)
    assert stream.losses == []


def test_each_event_goes_out_when_it_is_whole() -> None:
    """Never holding the stream: the text delta is out as soon as its chunk is, before the stream ends."""
    stream = MessagesOverChat().stream()
    first = stream.feed(sdk.chunks_of(_chunk({"content": "Hi"})).removesuffix(b"data: [DONE]\n\n"))
    assert [name for name, _ in sdk.events(first)] == ["message_start", "content_block_start", "content_block_delta"]
    assert stream.feed(SseEvent(None, json.dumps(_chunk({"content": "!"})))).count(b"text_delta") == 1


def test_a_chat_stream_error_is_an_anthropic_error_event() -> None:
    stream = MessagesOverChat().stream()
    out = stream.feed(sdk.chunks_of(_chunk({"content": "Hi"}), {"error": {"message": "overloaded", "type": "x"}}))
    assert sdk.events(out)[-2:][0] == ("content_block_stop", {"type": "content_block_stop", "index": 0})
    assert sdk.events(out)[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "overloaded"}})
    assert stream.flush() == b""  # ended: no message_stop after the error


def test_upstream_errors_take_the_clients_shape() -> None:
    chat_error = json.dumps({"error": {"message": "model busy", "type": "server_error"}}).encode()
    assert json.loads(MessagesOverChat().error(429, chat_error)) == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "model busy"}}  # fmt: skip
    anthropic_error = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}).encode()
    assert json.loads(ChatOverMessages().error(529, anthropic_error))["error"] == {
        "message": "busy", "type": "overloaded_error", "param": None, "code": None}  # fmt: skip
    assert json.loads(ChatOverMessages().error(502, b"Bad Gateway"))["error"]["message"] == "Bad Gateway"


def test_the_registry_has_both_directions_and_composes_through_chat() -> None:
    assert isinstance(translation("messages", "chat"), MessagesOverChat)
    assert isinstance(translation("chat", "messages"), ChatOverMessages)
    assert translation("chat", "chat") is None
    assert {("messages", "chat"), ("chat", "messages")} <= set(pairs())
    # messages -> chat -> messages: the round trip through chat keeps the conversation's words and tool ids.
    there_and_back = Composed(MessagesOverChat(), ChatOverMessages())
    body, lost = there_and_back.request(CONVERSATION)
    request = sdk.messages_request(body)
    assert request["messages"][1]["content"][-1] == {"type": "tool_use", "id": "toolu_01", "name": "weather",
                                                     "input": {"city": "Paris"}}  # fmt: skip
    assert "thinking_signature_dropped" in lost


def test_the_sse_reader_holds_only_an_unfinished_event() -> None:
    reader = SseReader()
    assert list(reader.feed(b"event: a\ndata: 1\n\nevent: b\nda")) == [SseEvent("a", "1")]
    assert list(reader.feed(b"ta: 2\r\n\r\n: keep-alive\n\n")) == [SseEvent("b", "2")]
    assert list(reader.feed(b"data: 3")) == [] and list(reader.flush()) == [SseEvent(None, "3")]


def test_a_composed_translation_carries_answers_streams_and_errors_through_chat() -> None:
    """messages -> chat -> messages: a Messages upstream's answer, stream and error come back through chat."""
    from tests.router.test_translate_chat_messages import MESSAGE, STREAM

    composed = Composed(MessagesOverChat(), ChatOverMessages())
    assert (composed.client, composed.upstream, composed.upstream_path) == ("messages", "messages", "/messages")
    composed.request({**CONVERSATION, "stream": True})
    answer, lost = composed.answer(MESSAGE)
    message = sdk.message(answer)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.stop_reason == "tool_use" and lost == ["thinking_signature_dropped"]
    stream = composed.stream()
    out = b"".join(stream.feed(piece) for piece in sdk.pieces(STREAM, 11)) + stream.flush()
    streamed = sdk.messages_stream(out)
    assert [b.type for b in streamed.content] == ["thinking", "text", "tool_use"]
    assert stream.losses == ["thinking_signature_dropped"]
    error = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}).encode()
    assert json.loads(composed.error(529, error))["error"] == {"type": "overloaded_error", "message": "busy"}
    assert sdk.events(stream.error("cut"))[-1][0] == "error"


def test_a_pair_not_registered_is_composed_where_both_halves_are(monkeypatch: pytest.MonkeyPatch) -> None:
    from router._translate import registry

    registry._load()
    assert translation("completions", "messages") is None  # no completions -> chat half
    monkeypatch.setitem(registry._PAIRS, ("completions", "chat"), MessagesOverChat)
    composed = translation("completions", "messages")
    assert isinstance(composed, Composed) and composed.upstream_path == "/messages"
    assert ("completions", "messages") in pairs()


def test_an_event_stream_tolerates_what_is_not_json() -> None:
    stream = MessagesOverChat().stream()
    assert stream.feed(b": keep-alive\n\ndata: not json\n\n") == b""
    assert stream.flush() == b""  # nothing started: nothing to end
    assert SseEvent(None, "[DONE]").json() is None


def test_the_load_check_knows_every_registered_pair() -> None:
    """`d3router check` (policies, which imports nothing of the router) decides from `policies.TRANSLATIONS`: it must
    list exactly the pairs router/_translate registers, or check would refuse a route that works, or pass one that
    fails at request time."""
    from policies import TRANSLATIONS, translatable
    from router._translate import registry

    registry._load()
    assert set(registry._PAIRS) == TRANSLATIONS
    assert all(translatable(a, b) == (translation(a, b) is not None) for a in APIS for b in APIS if a != b)


APIS = ("chat", "completions", "responses", "messages")
