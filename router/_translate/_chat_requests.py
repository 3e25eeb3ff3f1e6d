"""A chat request as a Responses request (issue 30.1): the other direction of `_responses_requests`.

    body, lost = chat_to_responses({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                              {"role": "user", "content": "hi"}]})
    # body == {"model": "m", "instructions": "Be brief.", "input": [{"type": "message", "role": "user",
    #          "content": "hi"}], "store": False}, lost == []

A leading system message (a string) is the `instructions`; tool calls and tool messages are `function_call` and
`function_call_output` items with their call ids (custom tools' `custom_tool_call(_output)`). Fields the Responses
API has no place for (`stop`, `n` above 1, the penalties, `seed`, `logit_bias`, audio, ...) are named
`NAME_dropped`; a chat model's `reasoning_content` sent back is never passed on to a model that did not make it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from router._translate._responses_requests import SAME, dicts
from router._translate.base import Body, dropped, named


def chat_to_responses(body: Body) -> tuple[Body, list[str]]:
    """A chat request as a Responses request (not stored: a chat client keeps its own conversation), and the names
    of what a Responses upstream cannot be given."""
    lost: list[str] = []
    out: Body = {key: body[key] for key in SAME if key in body and key != "top_logprobs"}
    messages = dicts(body.get("messages", []), "messages")
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        out["instructions"] = messages[0]["content"]
        messages = messages[1:]
    out["input"] = _input_items(messages, lost)
    tools = [_responses_tool(tool, lost) for tool in dicts(body.get("tools", []), "tools")]
    if any(tools):
        out["tools"] = [tool for tool in tools if tool]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = choice if isinstance(choice, str) else _responses_tool_choice(choice)
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if tokens is not None:
        out["max_output_tokens"] = tokens
    if body.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    text: Body = {}
    if body.get("response_format") is not None:
        text["format"] = _responses_format(body["response_format"])
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    if text:
        out["text"] = text
    if body.get("logprobs") and body.get("top_logprobs") is not None:
        out["top_logprobs"] = body["top_logprobs"]
    if body.get("logprobs"):
        out["include"] = ["message.output_text.logprobs"]
    out["store"] = bool(body.get("store", False))
    known = {
        *SAME,
        "messages",
        "tools",
        "tool_choice",
        "max_completion_tokens",
        "max_tokens",
        "reasoning_effort",
        "response_format",
        "verbosity",
        "logprobs",
        "store",
        "stream_options",
    }
    for key, value in body.items():
        if key not in known and not (key == "n" and value == 1) and value is not None:
            named(lost, dropped(key))
    return out, lost


def _input_items(messages: list[Body], lost: list[str]) -> list[Body]:
    items: list[Body] = []
    custom_calls: set[str] = set()  # a tool message answering a custom tool call is a custom_tool_call_output
    for message in messages:
        role = message.get("role")
        if message.get("name") is not None:
            named(lost, "message_name_dropped")
        if role == "assistant":
            content = message.get("content")
            parts = _output_parts(content, lost)
            if parts and all(part["type"] == "output_text" for part in parts):
                text = "".join(part["text"] for part in parts)  # an input message: what the SDK's types hold
                items.append({"type": "message", "role": "assistant", "content": text})
            elif parts:  # a refusal is held by an output message only, which has an id and a status
                items.append({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                              "status": "completed", "content": parts})  # fmt: skip
            if message.get("reasoning_content") or message.get("reasoning"):
                named(lost, "reasoning_dropped")  # never sent to a model that did not make it
            for call in dicts(message.get("tool_calls") or [], "messages.tool_calls"):
                items.append(_call_item(call, custom_calls))
            for key in ("audio", "function_call"):
                if message.get(key) is not None:
                    named(lost, f"assistant_{key}_dropped")
        elif role == "tool":
            call_id = message.get("tool_call_id")
            kind = "custom_tool_call_output" if call_id in custom_calls else "function_call_output"
            content = message.get("content")
            output = content if isinstance(content, str) else _input_parts(content, lost)
            items.append({"type": kind, "call_id": call_id, "output": output})
        elif role in ("user", "system", "developer"):
            content = message.get("content")
            content = content if isinstance(content, str) else _input_parts(content, lost)
            items.append({"type": "message", "role": role, "content": content})
        else:
            named(lost, dropped(role, "message_dropped"))
    return items


def _call_item(call: Body, custom_calls: set[str]) -> Body:
    if call.get("type") == "custom":
        custom_calls.add(str(call.get("id")))
        custom = call.get("custom") or {}
        return {
            "type": "custom_tool_call",
            "call_id": call.get("id"),
            "name": custom.get("name"),
            "input": custom.get("input", ""),
        }
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "call_id": call.get("id"),
        "name": function.get("name"),
        "arguments": function.get("arguments", ""),
    }


def _output_parts(content: Any, lost: list[str]) -> list[Body]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "output_text", "text": content, "annotations": []}]
    parts: list[Body] = []
    for part in dicts(content, "messages.content"):
        if part.get("type") == "text":
            parts.append({"type": "output_text", "text": part.get("text", ""), "annotations": []})
        elif part.get("type") == "refusal":
            parts.append({"type": "refusal", "refusal": part.get("refusal", "")})
        else:
            named(lost, "assistant_" + dropped(part.get("type")))
    return parts


_PART: dict[str, Callable[[Body], Body]] = {
    "text": lambda part: {"type": "input_text", "text": part.get("text", "")},
    "image_url": lambda part: {
        "type": "input_image",
        "image_url": (part.get("image_url") or {}).get("url"),
        "detail": (part.get("image_url") or {}).get("detail", "auto"),
    },
    "input_audio": lambda part: {"type": "input_audio", "input_audio": part.get("input_audio")},
    "file": lambda part: {"type": "input_file", **(part.get("file") or {})},
}


def _input_parts(content: Any, lost: list[str]) -> list[Body]:
    parts: list[Body] = []
    for part in dicts(content if content is not None else [], "messages.content"):
        make = _PART.get(str(part.get("type")))
        if make is None:
            named(lost, dropped(part.get("type"), "part_dropped"))
        else:
            parts.append(make(part))
    return parts


def _responses_tool(tool: Body, lost: list[str]) -> Body | None:
    kind = tool.get("type")
    if kind == "function":
        function = tool.get("function") or {}
        out = {
            "type": "function",
            **{key: function[key] for key in ("name", "description", "parameters") if key in function},
        }
        out["strict"] = bool(function.get("strict", False))  # the Responses API's default is strict, chat's not
        return out
    if kind == "custom":
        custom = dict(tool.get("custom") or {})
        format_ = custom.get("format")
        if isinstance(format_, dict) and format_.get("type") == "grammar":  # chat nests the grammar, Responses not
            custom["format"] = {"type": "grammar", **(format_.get("grammar") or {})}
        return {"type": "custom", **custom}
    named(lost, dropped(kind, "tool_dropped"))
    return None


def _responses_tool_choice(choice: Body) -> Body:
    kind = choice.get("type")
    if kind in ("function", "custom"):
        return {"type": kind, "name": (choice.get(kind) or {}).get("name")}
    if kind == "allowed_tools":
        allowed = choice.get("allowed_tools") or {}
        tools = [_responses_tool_choice(tool) for tool in allowed.get("tools", ())]
        return {"type": "allowed_tools", "mode": allowed.get("mode"), "tools": tools}
    return choice


def _responses_format(format_: Any) -> Any:
    if isinstance(format_, dict) and format_.get("type") == "json_schema":
        return {"type": "json_schema", **(format_.get("json_schema") or {})}
    return format_
