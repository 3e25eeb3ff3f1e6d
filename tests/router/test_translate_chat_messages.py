"""Chat Completions -> Messages translation (issue 30.3), the shapes checked by the real SDKs' types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router._translate.base import sse
from router._translate.chat_messages import DEFAULT_MAX_TOKENS, ChatOverMessages
from tests.router import _sdk_shapes as sdk

PNG = "iVBORw0KGgo="

CHAT: dict[str, Any] = {
    "model": "auto",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [
            {"type": "text", "text": "Weather here?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Rain"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "09:00"}]},
        {"role": "user", "content": "And tomorrow?"},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "description": "The weather",
                                                "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}],
    "tool_choice": "required", "parallel_tool_calls": False,
    "max_completion_tokens": 300, "temperature": 0.5, "top_p": 0.8, "stop": "END", "user": "u-1",
}  # fmt: skip


def test_a_chat_request_becomes_a_messages_request_the_anthropic_sdk_accepts() -> None:
    body, lost = ChatOverMessages().request(CHAT)
    checked = sdk.messages_request(body)
    assert checked["system"] == [{"type": "text", "text": "You are terse."}]
    user, assistant, results = checked["messages"]
    assert user["content"][1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                              "data": PNG}}  # fmt: skip
    assert user["content"][2] == {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert [(b["id"], b["input"]) for b in assistant["content"]] == [("call_1", {"city": "Oslo"}), ("call_2", {})]
    # Both tool results and the user's next words in one user turn, each result by its call's id.
    assert results["role"] == "user"
    assert [(b["type"], b.get("tool_use_id")) for b in results["content"]] == [
        ("tool_result", "call_1"), ("tool_result", "call_2"), ("text", None)]  # fmt: skip
    assert checked["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert (checked["max_tokens"], checked["stop_sequences"]) == (300, ["END"])
    assert checked["metadata"] == {"user_id": "u-1"} and checked["tools"][0]["description"] == "The weather"
    assert lost == ["temperature_dropped", "top_p_dropped"]  # Messages' current types take no sampling parameters


def test_max_tokens_is_always_sent() -> None:
    body, _ = ChatOverMessages().request({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert sdk.messages_request(body)["max_tokens"] == DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(("effort", "carried", "lost"), [
    ("high", {"output_config": {"effort": "high"}}, []), ("xhigh", {"output_config": {"effort": "xhigh"}}, []),
    ("minimal", {"output_config": {"effort": "low"}}, ["reasoning_effort_approximated"]),
    ("none", {"thinking": {"type": "disabled"}}, []),
])  # fmt: skip
def test_reasoning_effort_is_messages_effort(effort: str, carried: dict[str, Any], lost: list[str]) -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort}
    body, named = ChatOverMessages().request(plain)
    checked = sdk.messages_request(body)
    assert {key: checked[key] for key in carried} == carried and named == lost


def test_a_json_schema_response_format_is_the_output_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}  # fmt: skip
    body, _ = ChatOverMessages().request(plain)
    assert sdk.messages_request(body)["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


def test_what_messages_cannot_hold_is_named() -> None:
    parts = [{"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}} for n in range(6)]
    body = {**CHAT, "n": 2, "seed": 3, "logprobs": True, "temperature": 1.5, "metadata": {"k": "v"},
            "messages": [{"role": "user", "content": parts},
                         {"role": "assistant", "content": "ok", "reasoning_content": "hm"},
                         {"role": "system", "content": "late rule"},
                         {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "",
                                                                                               "format": "wav"}}]}]}  # fmt: skip
    out, lost = ChatOverMessages().request(body)
    checked = sdk.messages_request(out)
    carried = [b for m in checked["messages"] for b in m["content"] if "cache_control" in b]
    assert len(carried) == 4 and "temperature" not in out
    assert sorted(lost) == sorted(["cache_control_over_limit", "input_audio_part_dropped", "logprobs_dropped",
                                   "metadata_dropped", "n_dropped", "reasoning_dropped", "seed_dropped",
                                   "system_moved_to_top", "temperature_dropped", "top_p_dropped"])  # fmt: skip


MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
    "content": [{"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Rome"}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 4,
              "cache_creation_input_tokens": 2},
}  # fmt: skip


def test_a_message_becomes_a_chat_completion_the_openai_sdk_reads() -> None:
    answer, lost = ChatOverMessages().answer(MESSAGE)
    completion = sdk.completion(answer)
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Checking.")
    call = choice.message.tool_calls[0] if choice.message.tool_calls else None
    assert call is not None and call.type == "function"
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("toolu_1", "weather",
                                                                                  {"city": "Rome"})  # fmt: skip
    assert completion.usage is not None and (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        16, 5)  # fmt: skip
    assert answer["choices"][0]["message"]["reasoning_content"] == "Hmm."
    assert lost == ["thinking_signature_dropped"]


@pytest.mark.parametrize(("reason", "finish"), [("end_turn", "stop"), ("max_tokens", "length"),
                                                ("stop_sequence", "stop"), ("refusal", "content_filter")])  # fmt: skip
def test_stop_reasons_are_finish_reasons(reason: str, finish: str) -> None:
    answer, _ = ChatOverMessages().answer({**MESSAGE, "stop_reason": reason})
    assert sdk.completion(answer).choices[0].finish_reason == finish


def _events(*events: dict[str, Any]) -> bytes:
    return b"".join(sse(event, event["type"]) for event in events)


STREAM = _events(
    {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None,
                                          "usage": {"input_tokens": 10, "output_tokens": 1}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm."}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Check"}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ing."}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1",
                                                                  "name": "weather", "input": {}}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"city":'}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ' "Rome"}'}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
     "usage": {"output_tokens": 5}},
    {"type": "message_stop"},
)  # fmt: skip


@pytest.mark.parametrize("size", [len(STREAM), 13, 1])
def test_a_messages_stream_becomes_chat_chunks_the_openai_sdk_accumulates(size: int) -> None:
    tr = ChatOverMessages()
    tr.request({**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    stream = tr.stream()
    out = b"".join(stream.feed(piece) for piece in sdk.pieces(STREAM, size)) + stream.flush()
    completion, chunks = sdk.chat_stream(out)
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Checking.")
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls if c.type == "function"] == [
        ("toolu_1", "weather", '{"city": "Rome"}')]  # fmt: skip
    assert chunks[-1].usage is not None and (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (
        10, 5)  # fmt: skip
    assert stream.losses == ["thinking_signature_dropped"]


def test_no_usage_chunk_unless_asked_and_errors_are_chat_errors() -> None:
    stream = ChatOverMessages().stream()
    _, chunks = sdk.chat_stream(stream.feed(STREAM) + stream.flush())
    assert all(chunk.usage is None for chunk in chunks)
    stream = ChatOverMessages().stream()
    out = stream.feed(_events({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}))
    assert json.loads(out.removeprefix(b"data: "))["error"]["message"] == "busy"
