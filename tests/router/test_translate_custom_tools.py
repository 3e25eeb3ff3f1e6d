"""A Responses custom tool (Codex's `apply_patch`) carried to a chat upstream as a function tool (issue 30.1): the
request (tools, `tool_choice`, the earlier turns' custom calls and outputs) as chat requests the `openai` SDK's types
and vLLM's own request model accept, and a call of that function back as a `custom_tool_call`, whole and streamed
(streams cut at every byte, argument strings cut at every character), never held."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router._translate._custom_tools import GRAMMAR_CHARS, InputStream, input_of
from router._translate.registry import translation
from router._translate.responses_chat import ResponsesOverChat
from tests.router._sdk_shapes import chat_request, events
from tests.router.test_translate_responses_codex import APPLY_PATCH, EXEC, GRAMMAR, codex_request

EVENT = TypeAdapter(ResponseStreamEvent)
PATCH = '*** Begin Patch\n*** Add File: /tmp/a "b".txt\n+caf\u00e9 \\ \U0001f600\n*** End Patch\n'


def over_chat(body: dict[str, Any]) -> tuple[ResponsesOverChat, dict[str, Any], list[str]]:
    tr = translation("responses", "chat")
    assert isinstance(tr, ResponsesOverChat)
    chat, lost = tr.request(body)
    return tr, chat, lost


def test_a_custom_tool_is_a_function_taking_its_input_as_one_string() -> None:
    body = {**codex_request(EXEC, APPLY_PATCH), "tool_choice": {"type": "custom", "name": "apply_patch"}}
    body["input"] += [
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done."},
    ]
    _, chat, lost = over_chat(body)
    chat_request(chat)  # the openai SDK's chat types accept it
    patch = chat["tools"][1]
    assert patch["type"] == "function" and patch["function"]["name"] == "apply_patch"
    assert patch["function"]["description"] == "Edit files."
    parameters = patch["function"]["parameters"]
    assert parameters["required"] == ["input"] and parameters["properties"]["input"]["type"] == "string"
    assert parameters["properties"]["input"]["description"].endswith("lark grammar:\n" + GRAMMAR)  # the format
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    call, result = chat["messages"][-2:]
    arguments = json.dumps({"input": PATCH}, ensure_ascii=False)
    assert call["tool_calls"] == [{"id": "call_p", "type": "function",
                                   "function": {"name": "apply_patch", "arguments": arguments}}]  # fmt: skip
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert result == {"role": "tool", "tool_call_id": "call_p", "content": "Done."}
    assert "custom_tool_as_function" in lost


def test_a_free_form_tool_a_long_grammar_and_an_allowed_tools_choice() -> None:
    free = {"type": "custom", "name": "note", "format": {"type": "text"}}
    long = {**APPLY_PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": "a" * (GRAMMAR_CHARS + 50)}}
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "custom", "name": "note"}]}
    _, chat, _ = over_chat({"model": "m", "input": "hi", "tools": [free, long], "tool_choice": choice})
    chat_request(chat)
    about = [tool["function"]["parameters"]["properties"]["input"]["description"] for tool in chat["tools"]]
    assert about[0] == "The tool's input, free-form text." and "description" not in chat["tools"][0]["function"]
    assert "regex grammar" in about[1] and len(about[1]) < GRAMMAR_CHARS + 100 and about[1].endswith("a\n...")
    assert chat["tool_choice"]["allowed_tools"]["tools"] == [{"type": "function", "function": {"name": "note"}}]


def test_vllms_own_request_model_takes_the_translated_codex_request() -> None:
    """vLLM's chat server (0.32) takes function tools only: the translated Codex request passes its request model,
    which refuses the custom tool `native` sends."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # imported here: slow (~6 s)

    body = codex_request(EXEC, APPLY_PATCH, {"type": "web_search", "external_web_access": True})
    body["input"] += [{"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH}]
    _, chat, _ = over_chat(body)
    ChatCompletionRequest.model_validate(chat)
    native = translation("responses", "chat")
    assert isinstance(native, ResponsesOverChat)
    native.custom_tools = "native"
    with pytest.raises(ValueError, match="function"):
        ChatCompletionRequest.model_validate(native.request(body)[0])


def completion(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "created": 7, "model": "up",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": list(calls)}}]}  # fmt: skip


def function(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_call_of_the_function_is_a_custom_tool_call_again() -> None:
    tr, _, _ = over_chat(codex_request(EXEC, APPLY_PATCH))
    answer = completion(function("c1", "apply_patch", json.dumps({"input": PATCH})),
                        function("c2", "exec_command", '{"cmd": "ls"}'),
                        function("c3", "apply_patch", "not json"))  # fmt: skip
    response, lost = tr.answer(answer)
    patch, shell, odd = Response.model_validate(response).output
    assert patch.type == "custom_tool_call" and (patch.call_id, patch.name, patch.input) == ("c1", "apply_patch", PATCH)
    assert shell.type == "function_call" and shell.arguments == '{"cmd": "ls"}'  # a function tool's call stays one
    assert odd.type == "custom_tool_call" and odd.input == "not json"  # no `input`: the arguments as they came
    assert lost == []


def test_a_namespaced_custom_tool_comes_back_with_its_namespace() -> None:
    tools = [{"type": "namespace", "name": "files", "description": "Files.", "tools": [APPLY_PATCH]}]
    tr, chat, _ = over_chat({"model": "m", "input": "hi", "tools": tools})
    assert chat["tools"][0]["function"]["name"] == "files__apply_patch"
    item = Response.model_validate(tr.answer(completion(function("c1", "files__apply_patch", '{"input": "x"}')))[0])
    call = item.output[0]
    assert call.type == "custom_tool_call" and (call.namespace, call.name, call.input) == ("files", "apply_patch", "x")


ARGUMENTS = [
    json.dumps({"input": PATCH}),  # \n, \", \\ and a surrogate pair as escapes
    json.dumps({"input": PATCH}, ensure_ascii=False),
    ' {\n  "input" : "a\\u00e9\\/b\\t"\n}',
    '{"input": "x", "more": 1}',
]


@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_streamed_arguments_decode_to_the_input_however_they_are_cut(arguments: str) -> None:
    whole = json.loads(arguments)["input"]
    for cut in range(len(arguments) + 1):
        for pieces in ([arguments[:cut], arguments[cut:]], [arguments[:cut], *arguments[cut:]]):
            decoder = InputStream()
            assert "".join(decoder.feed(piece) for piece in pieces) + decoder.end() == whole, (cut, pieces)
    decoder = InputStream()
    assert decoder.feed(arguments[:-3]) == whole[:-1] or not whole.endswith("\n")  # not held: all but the end


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans(), st.lists(st.integers(0, 400), max_size=8), st.sampled_from(["", " ", "\n  "]))
def test_any_input_cut_anywhere_decodes_to_itself(text: str, ascii_only: bool, cuts: list[int], space: str) -> None:
    """Hypothesis: any text (lone surrogates too, as `?`), escaped or not, with JSON's whitespace, cut anywhere."""
    arguments = "{" + space + '"input"' + space + ":" + space + json.dumps(text, ensure_ascii=ascii_only) + space + "}"
    bounds = sorted({0, len(arguments), *(cut % (len(arguments) + 1) for cut in cuts)})
    decoder = InputStream()
    fed = "".join(decoder.feed(arguments[a:b]) for a, b in pairwise(bounds)) + decoder.end()
    assert fed == input_of(arguments) == text.encode("utf-8", "replace").decode("utf-8")


def test_the_input_is_given_as_it_comes() -> None:
    decoder = InputStream()
    assert [decoder.feed(piece) for piece in ['{"inp', 'ut": "*** Be', "gin\\", "n\\u00", "e9", '"}']] == [
        "", "*** Be", "gin", "\n", "\u00e9", ""]  # fmt: skip


def test_arguments_of_another_shape_are_held_and_read_whole() -> None:
    for arguments, whole in [('{"more": 1, "input": "x"}', "x"), ('{"a": "input\\": \\"y", "input": "x"}', "x"),
                             ('{"input": 3}', '{"input": 3}'), ("raw", "raw"), ("", ""),
                             ('{"input": "\\ud83d"}', "?")]:  # fmt: skip
        decoder = InputStream()
        fed = "".join(decoder.feed(char) for char in arguments)
        assert fed + decoder.end() == whole == input_of(arguments), arguments


def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "up",
                            "choices": choices}  # fmt: skip
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def call_chunks(arguments: str, pieces: int = 3) -> list[bytes]:
    size = -(-len(arguments) // pieces)
    head = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "apply_patch", "arguments": ""}}
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [head]}),
        *(chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[at : at + size]}}]})
          for at in range(0, len(arguments), size)),
        chunk({}, "tool_calls"),
        chunk(None, usage={"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}),
        b"data: [DONE]\n\n",
    ]  # fmt: skip


def test_a_streamed_call_is_a_streamed_custom_tool_call_not_held() -> None:
    tr, _, _ = over_chat(codex_request(EXEC, APPLY_PATCH))
    stream = tr.stream()
    out = [stream.feed(piece) for piece in call_chunks(json.dumps({"input": PATCH}))]
    first = [event for _, event in events(out[2])]
    assert [event["type"] for event in first] == ["response.custom_tool_call_input.delta"]  # at once, decoded
    assert PATCH.startswith(first[0]["delta"]) and first[0]["delta"].startswith("*** Begin Patch\n")
    seen = [event for _, event in events(b"".join(out) + stream.flush())]
    for event in seen:
        EVENT.validate_python(event)
    assert [event["type"] for event in seen] == [
        "response.created", "response.in_progress", "response.output_item.added",
        *["response.custom_tool_call_input.delta"] * 3, "response.custom_tool_call_input.done",
        "response.output_item.done", "response.completed"]  # fmt: skip
    assert seen[2]["item"]["type"] == "custom_tool_call" and seen[2]["item"]["input"] == ""
    deltas = "".join(event["delta"] for event in seen if event["type"].endswith("input.delta"))
    assert deltas == seen[6]["input"] == seen[7]["item"]["input"] == PATCH
    final = Response.model_validate(seen[-1]["response"]).output[0]
    assert final.type == "custom_tool_call" and (final.call_id, final.name, final.input) == ("call_9", "apply_patch",
                                                                                             PATCH)  # fmt: skip


@pytest.mark.parametrize("arguments", [json.dumps({"input": PATCH}), '{"other": 1, "input": "held"}'])
def test_a_streamed_call_cut_at_every_byte_tells_the_same_input(arguments: str) -> None:
    raw = b"".join(call_chunks(arguments))
    whole = json.loads(arguments)["input"]
    for cut in range(len(raw) + 1):
        tr, _, _ = over_chat(codex_request(APPLY_PATCH))
        stream = tr.stream()
        seen = [event for _, event in events(stream.feed(raw[:cut]) + stream.feed(raw[cut:]) + stream.flush())]
        assert [event["sequence_number"] for event in seen] == list(range(len(seen)))
        deltas = "".join(event["delta"] for event in seen if event["type"] == "response.custom_tool_call_input.delta")
        done = [event["input"] for event in seen if event["type"] == "response.custom_tool_call_input.done"]
        assert deltas == whole and done == [whole], cut
        assert Response.model_validate(seen[-1]["response"]).output[0].input == whole  # type: ignore[union-attr]


def test_native_keeps_chats_custom_tools() -> None:
    tr = translation("responses", "chat")
    assert isinstance(tr, ResponsesOverChat)
    tr.custom_tools = "native"
    chat, lost = tr.request(codex_request(APPLY_PATCH))
    assert chat["tools"][0]["type"] == "custom" and "custom_tool_as_function" not in lost
    item = Response.model_validate(tr.answer(completion(function("c1", "apply_patch", '{"input": "x"}')))[0])
    assert item.output[0].type == "function_call"  # only a function tool's call comes as a function call there


def test_a_custom_tool_reaches_a_messages_upstream_as_a_tool_through_chat() -> None:
    composed = translation("responses", "messages")
    assert composed is not None
    body, lost = composed.request({"model": "m", "input": "hi", "tools": [APPLY_PATCH]})
    assert body["tools"][0]["name"] == "apply_patch" and body["tools"][0]["input_schema"]["required"] == ["input"]
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
               "content": [{"type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {"input": PATCH}}]}  # fmt: skip
    call = Response.model_validate(composed.answer(message)[0]).output[0]
    assert call.type == "custom_tool_call" and call.input == PATCH and "custom_tool_as_function" in lost
