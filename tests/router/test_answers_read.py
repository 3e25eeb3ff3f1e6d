"""Reading an upstream's answer for an answer guard (router/_apis/answers.py): content given as parts, parts without
text, and fields of the wrong type read as nothing, never as a crash or a stray word; and a Messages request's text
blocks read as one turn's text, a Responses tool call as an assistant turn. Pinned where mutmut found changes no
test of its selection noticed (issue 23)."""

from __future__ import annotations

import json

from router import API_BY_NAME
from router._apis.answers import Answered, Call, read_answer
from router._apis.content import Content
from router._apis.state import Turn


def test_text_parts_are_joined_as_they_are_and_a_part_without_text_adds_nothing() -> None:
    content = [{"type": "text", "text": "Hel"}, {"type": "image_url"}, "not a part", {"type": "text", "text": "lo"}]
    body = {"choices": [{"message": {"content": content}}]}
    assert read_answer("chat", json.dumps(body).encode(), streamed=False) == Answered("Hello", [])


def test_fields_of_the_wrong_type_read_as_nothing() -> None:
    body = {"choices": [{"message": None}, {"message": "hi"}, {"message": {"content": "ok", "tool_calls": [
        {"function": None}, {"function": {"name": "run", "arguments": {"cmd": "ls"}}}]}}]}  # fmt: skip
    assert read_answer("chat", json.dumps(body).encode(), streamed=False) == Answered(
        "ok", [Call("", ""), Call("run", '{"cmd": "ls"}')]
    )


def test_a_messages_turns_text_blocks_are_one_text_a_line_each() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert API_BY_NAME["messages"].turns(body, Content(lenient=False)) == [Turn("user", "a\nb")]


def test_a_responses_function_call_item_is_an_assistant_turn_with_the_call_and_no_text() -> None:
    body = {"input": [{"role": "user", "content": "run ls"},
                      {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":"ls"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}]}  # fmt: skip
    assert API_BY_NAME["responses"].turns(body, Content(lenient=False)) == [
        Turn("user", "run ls"),
        Turn("assistant", "", (), ('[tool call] shell({"cmd":"ls"})',)),
        Turn("tool", "a.txt"),
    ]
