"""What the real Codex CLI's Responses requests revealed on a route to a chat upstream (issue 30): its requests, in
the shape `codex exec` sends them (tests/agents/test_codex_chat.py runs the CLI itself), translated to chat requests
the `openai` SDK's types accept, with every field chat cannot hold named."""

from __future__ import annotations

from typing import Any

import pydantic
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

from policies import ApiName
from router._translate.registry import translation
from router._translate.responses_chat import ResponsesOverChat
from tests.router._sdk_shapes import chat_request

GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}  # fmt: skip
EXEC = {"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}  # fmt: skip
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for spawning and managing sub-agents.",
          "tools": [{"type": "function", "name": "spawn_agent", "strict": False,
                     "parameters": {"type": "object", "properties": {}}}]}  # fmt: skip
_RESPONSES_PARAMS = pydantic.TypeAdapter(ResponseCreateParamsNonStreaming)


def carry(
    body: dict[str, Any], client: ApiName = "responses", upstream: ApiName = "chat"
) -> tuple[dict[str, Any], list[str]]:
    found = translation(client, upstream)
    assert found is not None
    return found.request(body)


def codex_request(*tools: dict[str, Any]) -> dict[str, Any]:
    """A second turn as `codex exec` sends it: developer instructions, the user's task, the model's reasoning item,
    its call of the shell tool and the command's output."""
    return {
        "model": "gpt-5.5",
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent running in the Codex CLI."}]},
            {"type": "message", "id": "msg_2", "role": "user",
             "content": [{"type": "input_text", "text": "READ notes.txt and tell me what it says"}]},
            {"type": "reasoning", "id": "rs_4", "summary": [{"type": "summary_text", "text": "Read it."}],
             "content": None, "encrypted_content": None},
            {"type": "function_call", "status": "completed", "id": "fc_4", "name": "exec_command",
             "arguments": '{"cmd": "cat notes.txt"}', "call_id": "call_4"},
            {"type": "function_call_output", "id": "fco_1", "call_id": "call_4", "output": "the answer is 42\n"},
        ],
        "tools": list(tools),
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a23bf3",
        "text": {"verbosity": "low"},
        "client_metadata": {"session_id": "01a23bf3"},
    }  # fmt: skip


def test_codexs_request_is_a_chat_request_the_sdk_accepts_with_its_losses_named() -> None:
    body = codex_request(EXEC, APPLY_PATCH, {"type": "tool_search", "execution": "client"},
                         {"type": "web_search", "external_web_access": True})  # fmt: skip
    chat, lost = carry(body)
    chat_request(chat)  # the openai SDK's chat types accept every tool, message and parameter
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["tool_calls"][0]["id"] == chat["messages"][3]["tool_call_id"] == "call_4"
    assert (chat["reasoning_effort"], chat["verbosity"], chat["parallel_tool_calls"]) == ("medium", "low", True)
    assert [tool["type"] for tool in chat["tools"]] == ["function", "function"]  # apply_patch as a function
    assert sorted(lost) == sorted(["reasoning_summary_dropped", "reasoning_item_dropped", "include_dropped",
                                   "tool_search_tool_dropped", "web_search_tool_dropped", "client_metadata_dropped",
                                   "custom_tool_as_function"])  # fmt: skip


def test_a_custom_tools_grammar_is_nested_in_chats_spelling_and_back() -> None:
    """Codex's `apply_patch` is a custom tool with a Lark grammar: the Responses API has the grammar's `definition`
    and `syntax` beside `type`, chat nests them in `grammar` (`custom_tools: native`, for OpenAI's chat API)."""
    native = translation("responses", "chat")
    assert isinstance(native, ResponsesOverChat)
    native.custom_tools = "native"
    chat, lost = native.request(codex_request(APPLY_PATCH))
    assert not [name for name in lost if name.startswith("tool_")]
    assert chat["tools"] == [{"type": "custom", "custom": {"name": "apply_patch", "description": "Edit files.",
                              "format": {"type": "grammar", "grammar": {"definition": GRAMMAR, "syntax": "lark"}}}}]  # fmt: skip
    chat_request(chat)
    back, more = carry(chat, "chat", "responses")
    assert back["tools"] == [APPLY_PATCH] and "tool_format_dropped" not in more
    _RESPONSES_PARAMS.validate_python({k: v for k, v in back.items() if k != "stream"})


def test_tool_fields_chat_has_no_place_for_are_named() -> None:
    deferred = {**EXEC, "defer_loading": True, "output_schema": {"type": "object"}}
    chat, lost = carry(codex_request(deferred, AGENTS))
    chat_request(chat)
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["exec_command", "multi_agent_v1__spawn_agent"]
    assert {"tool_defer_loading_dropped", "tool_output_schema_dropped", "namespace_description_dropped"} <= set(lost)
    _, lost = carry(codex_request({**EXEC, "defer_loading": False}))
    assert not [name for name in lost if name.startswith("tool_")]  # an unset field loses nothing
