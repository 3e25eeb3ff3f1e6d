"""The Responses API <-> Chat Completions pair (issue 30.1): requests, whole answers, streams and errors, both ways;
every answer and event checked against the `openai` SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from policies import translatable
from router._errors import BadRequest
from router._translate.base import SseReader
from router._translate.registry import pairs, translation
from router._translate.responses_chat import ChatOverResponses, ResponsesOverChat

EVENT = TypeAdapter(ResponseStreamEvent)


def over_chat() -> ResponsesOverChat:
    found = translation("responses", "chat")
    assert isinstance(found, ResponsesOverChat)
    return found


def over_responses() -> ChatOverResponses:
    found = translation("chat", "responses")
    assert isinstance(found, ChatOverResponses)
    return found


def events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON of each event (`[DONE]` as the string)."""
    reader = SseReader()
    return [event.json() if event.data != "[DONE]" else "[DONE]" for event in [*reader.feed(raw), *reader.flush()]]


def chat_sse(*chunks: dict[str, Any] | str) -> list[bytes]:
    return [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None
          ) -> dict[str, Any]:  # fmt: skip
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "up"}
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return body


# ---- Responses client, chat upstream: the request ---------------------------------------------------------------


def test_responses_request_as_chat() -> None:
    body = {
        "model": "auto",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is in"},
                {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "low"},
            ]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": '{"q": 1}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "a cat"},
        ],
        "tools": [{"type": "function", "name": "look", "description": "Look.", "parameters": {"type": "object"},
                   "strict": False}, {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "look"},
        "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 64, "parallel_tool_calls": False,
        "reasoning": {"effort": "low"}, "metadata": {"k": "v"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
        "stream": True,
    }  # fmt: skip
    chat, lost = over_chat().request(body)
    assert chat == {
        "model": "auto", "temperature": 0.5, "top_p": 0.9, "parallel_tool_calls": False, "metadata": {"k": "v"},
        "stream": True, "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": [{"type": "text", "text": "What is in"},
                                         {"type": "image_url", "image_url": {"url": "https://x.test/a.png",
                                                                             "detail": "low"}}]},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": '{"q": 1}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        ],
        "tools": [{"type": "function", "function": {"name": "look", "description": "Look.",
                                                    "parameters": {"type": "object"}, "strict": False}}],
        "tool_choice": {"type": "function", "function": {"name": "look"}},
        "max_completion_tokens": 64, "reasoning_effort": "low",
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}},
    }  # fmt: skip
    assert lost == ["web_search_tool_dropped"]


def test_reasoning_items_are_never_sent_to_a_chat_model() -> None:
    body = {"model": "m", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thought"}],
         "encrypted_content": "SECRET"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ], "store": True, "reasoning": {"effort": "high", "summary": "auto"}}  # fmt: skip
    chat, lost = over_chat().request(body)
    assert "SECRET" not in json.dumps(chat) and "thought" not in json.dumps(chat)
    assert chat["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}  # fmt: skip
    assert lost == ["reasoning_item_dropped", "web_search_call_item_dropped", "reasoning_summary_dropped",
                    "store_dropped"]  # fmt: skip


@pytest.mark.parametrize("field", ["previous_response_id", "conversation", "prompt"])
def test_server_state_is_refused_for_a_chat_upstream(field: str) -> None:
    with pytest.raises(BadRequest, match=rf"^{field} cannot be carried to a Chat Completions upstream") as caught:
        over_chat().request({"model": "m", "input": "hi", field: "resp_1"})
    assert caught.value.param == field


# ---- Responses client, chat upstream: the answers ---------------------------------------------------------------

COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "up",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Looking.", "reasoning_content": "I should look.",
        "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "look", "arguments": '{"q":1}'}}]}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16,
              "prompt_tokens_details": {"cached_tokens": 3}},
}  # fmt: skip


def test_chat_answer_as_a_response() -> None:
    tr = over_chat()
    tr.request({"model": "auto", "instructions": "Be brief.", "input": "hi", "metadata": {"k": "v"},
                "tools": [{"type": "function", "name": "look", "parameters": {}, "strict": True}]})  # fmt: skip
    body, lost = tr.answer(COMPLETION)
    response = Response.model_validate(body)
    assert lost == []
    assert (response.status, response.incomplete_details, response.instructions) == ("completed", None, "Be brief.")
    assert response.metadata == {"k": "v"} and response.tools[0].type == "function"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text == "Looking."
    call = response.output[2]
    assert call.type == "function_call" and (call.call_id, call.name, call.arguments) == ("call_9", "look", '{"q":1}')
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (11, 5, 16)
    assert response.usage.input_tokens_details.cached_tokens == 3


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_a_cut_chat_answer_is_an_incomplete_response(finish: str, reason: str) -> None:
    answer = {**COMPLETION, "choices": [{"index": 0, "finish_reason": finish, "message": {"content": "Lo"}}]}
    response = Response.model_validate(over_chat().answer(answer)[0])
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == reason


# ---- Responses client, chat upstream: the stream ----------------------------------------------------------------


def test_chat_stream_as_response_events() -> None:
    tr = over_chat()
    tr.request({"model": "auto", "input": "hi", "stream": True})
    stream = tr.stream()
    chunks = chat_sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Hmm."}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "look", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({}, "tool_calls"),
        chunk(None, usage={"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}),
        "[DONE]",
    )  # fmt: skip
    out = [stream.feed(piece) for piece in chunks]
    # Nothing held back: the first text is its delta at once, each argument piece its own delta.
    assert [e["type"] for e in events(out[2])] == [
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta"]  # fmt: skip
    assert [e["delta"] for e in events(out[3])] == ["lo"]
    assert [e["delta"] for e in events(out[6])] == [": 1}"]
    seen = events(b"".join(out) + stream.flush())
    for event in seen:
        EVENT.validate_python(event)
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    assert [e["type"] for e in seen] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    final = Response.model_validate(seen[-1]["response"])
    assert final.id == seen[0]["response"]["id"] and final.status == "completed" and final.output_text == "Hello"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (4, 6)
    call = final.output[2]
    assert call.type == "function_call" and (call.call_id, call.arguments) == ("call_1", '{"q": 1}')
    assert stream.losses == []


def test_chat_stream_cut_by_length_ends_incomplete_and_errors_in_responses_shape() -> None:
    stream = over_chat().stream()
    out = b"".join(stream.feed(piece) for piece in chat_sse(chunk({"content": "x"}), chunk({}, "length")))
    last = events(out + stream.flush())[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    stream = over_chat().stream()
    stream.feed(chat_sse(chunk({"content": "x"}))[0])
    error = events(stream.feed(chat_sse({"error": {"message": "boom", "type": "x"}})[0]))
    assert [EVENT.validate_python(e).type for e in error] == ["error"] and error[0]["message"] == "boom"
    assert stream.flush() == b""


# ---- chat client, Responses upstream -----------------------------------------------------------------------------


def test_chat_request_as_responses() -> None:
    body = {
        "model": "auto",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Look"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        ],
        "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
        "tool_choice": "required", "max_tokens": 32, "reasoning_effort": "medium", "stop": ["\n"], "seed": 1,
        "response_format": {"type": "json_object"}, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    out, lost = over_responses().request(body)
    assert out == {
        "model": "auto", "stream": True, "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"}]},
            {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a cat"},
        ],
        "tools": [{"type": "function", "name": "look", "parameters": {"type": "object"}, "strict": False}],
        "tool_choice": "required", "max_output_tokens": 32, "reasoning": {"effort": "medium"},
        "text": {"format": {"type": "json_object"}}, "store": False,
    }  # fmt: skip
    assert lost == ["stop_dropped", "seed_dropped"]


def test_response_as_a_chat_completion() -> None:
    response = {
        "id": "resp_1", "object": "response", "created_at": 1700000000, "model": "up", "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Hmm."}],
             "encrypted_content": "SECRET"},
            {"type": "message", "id": "m", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Hi", "annotations": []}]},
            {"type": "function_call", "id": "fc", "call_id": "call_1", "name": "look", "arguments": "{}"},
            {"type": "web_search_call", "id": "ws", "status": "completed"},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
                  "output_tokens_details": {"reasoning_tokens": 1}},
    }  # fmt: skip
    body, lost = over_responses().answer(response)
    completion = ChatCompletion.model_validate(body)
    assert lost == ["reasoning_encrypted_content_dropped", "web_search_call_dropped"]
    assert "SECRET" not in json.dumps(body)
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Hi")
    assert choice.message.tool_calls is not None and choice.message.tool_calls[0].id == "call_1"
    assert body["choices"][0]["message"]["reasoning_content"] == "Hmm."
    usage = completion.usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (3, 2)
    incomplete = {**response, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert over_responses().answer(incomplete)[0]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("include_usage", [True, False])
def test_response_events_as_chat_chunks(include_usage: bool) -> None:
    tr = over_responses()
    tr.request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "stream_options": {"include_usage": include_usage}})  # fmt: skip
    stream = tr.stream()
    head = {"id": "resp_1", "object": "response", "created_at": 5, "model": "up", "output": [], "tools": [],
            "parallel_tool_calls": True, "tool_choice": "auto"}  # fmt: skip
    upstream = [
        {"type": "response.created", "response": {**head, "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "m"}},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"},
        {"type": "response.output_item.added", "output_index": 1, "item": {
            "type": "function_call", "id": "fc", "call_id": "call_1", "name": "look", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{}"},
        {"type": "response.completed", "response": {**head, "status": "completed",
                                                    "usage": {"input_tokens": 3, "output_tokens": 2}}},
    ]  # fmt: skip
    raw = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in upstream]
    out = [stream.feed(piece) for piece in raw]
    assert [json.loads(c)["choices"][0]["delta"] for c in [out[2].split(b"data: ")[1]]] == [{"content": "Hi"}]
    seen = events(b"".join(out) + stream.flush())
    assert seen[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(c) for c in seen[:-1]]
    assert all(c.id == "resp_1" and c.model == "up" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi"
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    assert calls[0].id == "call_1" and "".join(call.function.arguments or "" for call in calls if call.function) == "{}"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == ([(3, 2)] if include_usage else [])


# ---- errors and the composed pairs -------------------------------------------------------------------------------


def test_errors_in_the_openai_shape() -> None:
    error = {"error": {"message": "Too many", "type": "rate_limit_error", "param": None, "code": "rate"}}
    for tr in (over_chat(), over_responses()):
        assert json.loads(tr.error(429, json.dumps(error).encode())) == error
        assert json.loads(tr.error(502, b"bad gateway"))["error"]["message"] == "bad gateway"


def test_responses_reaches_messages_through_chat() -> None:
    composed = translation("responses", "messages")
    assert composed is not None and composed.upstream_path == "/messages"
    body, lost = composed.request({"model": "m", "instructions": "Be brief.", "input": "hi", "stop": None})
    assert body["system"] and body["messages"][0]["role"] == "user" and lost == []


def test_custom_tools_both_ways_kept_custom_for_a_chat_api_that_takes_them() -> None:
    """`custom_tools: native` (OpenAI's chat API takes chat's custom tools): carried as they are, both ways."""
    native = over_chat()
    native.custom_tools = "native"
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "Patch it."},
            {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done."},
        ],
        "tools": [{"type": "custom", "name": "apply_patch", "description": "Patch.", "format": {"type": "text"}}],
    }
    chat, lost = native.request(body)
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}]},
        {"role": "tool", "tool_call_id": "call_p", "content": "Done."},
    ]  # fmt: skip
    assert chat["tools"] == [{"type": "custom", "custom": {"name": "apply_patch", "description": "Patch.",
                                                           "format": {"type": "text"}}}]  # fmt: skip
    back, more = over_responses().request(chat)
    assert back["input"][1:] == body["input"][1:] and back["tools"] == body["tools"] and lost == more == []
    answer = {**COMPLETION, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": "call_q", "type": "custom", "custom": {"name": "apply_patch", "input": "x"}}]}}]}  # fmt: skip
    item = Response.model_validate(native.answer(answer)[0]).output[0]
    assert item.type == "custom_tool_call" and (item.call_id, item.name, item.input) == ("call_q", "apply_patch", "x")
    again = ChatCompletion.model_validate(over_responses().answer(item_response(item.model_dump()))[0])
    assert again.choices[0].message.tool_calls is not None and again.choices[0].finish_reason == "tool_calls"


def item_response(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "model": "up", "status": "completed",
            "output": [item]}  # fmt: skip


def test_namespaced_tools_are_flat_in_chat_and_named_again_in_the_answer() -> None:
    """Codex groups its sub-agent tools in a `namespace` tool: chat gets them as `NAMESPACE__NAME` functions, and a
    call of one comes back with its namespace and name."""
    spawn = {"type": "function", "name": "spawn", "parameters": {"type": "object"}, "strict": False}
    body = {"model": "m", "input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "namespace": "agents", "name": "spawn", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "spawned"},
    ], "tools": [{"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [spawn]}]}  # fmt: skip
    tr = over_chat()
    chat, lost = tr.request(body)
    assert chat["tools"] == [{"type": "function", "function": {"name": "agents__spawn", "parameters": {"type": "object"},
                                                               "strict": False}}]  # fmt: skip
    assert chat["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__spawn"
    assert lost == ["namespace_description_dropped"]  # chat has no groups of tools to describe
    call = {"id": "c2", "type": "function", "function": {"name": "agents__spawn", "arguments": "{}"}}
    answer = {**COMPLETION, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"tool_calls": [call]}}]}
    item = Response.model_validate(tr.answer(answer)[0]).output[0]
    assert item.type == "function_call" and (item.namespace, item.name) == ("agents", "spawn")
    stream = tr.stream()
    raw = b"".join(stream.feed(piece) for piece in chat_sse(chunk({"tool_calls": [{"index": 0, **call}]}), "[DONE]"))
    added = [e for e in events(raw + stream.flush()) if e["type"] == "response.output_item.added"]
    assert (added[0]["item"]["namespace"], added[0]["item"]["name"]) == ("agents", "spawn")


def test_the_checked_pairs_are_the_registered_ones() -> None:
    """`d3router check` tells a route no translation carries from the pairs policies lists: the same as the
    registry's, composed ones included."""
    apis = ("chat", "completions", "responses", "messages")
    listed = {(a, b) for a in apis for b in apis if a != b and translatable(a, b)}
    assert listed == set(pairs())
    assert {("responses", "chat"), ("chat", "responses"), ("responses", "messages")} <= listed
