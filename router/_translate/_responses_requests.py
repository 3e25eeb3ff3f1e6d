"""A Responses request as a chat request (issue 30.1); `error_body` for both directions' errors.

    body, lost = responses_to_chat({"model": "m", "instructions": "Be brief.", "input": "hi"})
    # body == {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
    #                                     {"role": "user", "content": "hi"}]}, lost == []

What chat cannot hold is left out and named (`web_search_tool_dropped`, `reasoning_item_dropped`,
`store_dropped`, ...), never dropped silently; what would change the answer's meaning behind the client's back is
refused (400): `previous_response_id`, `conversation` and `prompt` refer to state kept at a Responses server, which
a chat upstream has not got. Reasoning items are never sent on: no chat model made them. Custom tools (Codex's
`apply_patch`) go as function tools taking one string, `input` (`_custom_tools`; `custom_tool_as_function`), unless
the upstream is set to take chat's own (`custom_tools: native`). The other direction is
`_chat_requests`; the answers and the streams are in `_responses_answers` and `_responses_streams`.
"""

from __future__ import annotations

import json
from typing import Any

from router._errors import BadRequest
from router._translate._custom_tools import LOSS, function_call, function_tool
from router._translate.base import Body, dropped, named

# The sampling and bookkeeping fields both APIs spell and mean the same way.
SAME = (
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "metadata",
    "stream",
    "top_logprobs",
)
# Responses fields that need no carrying: the chat upstream behaves so anyway (`store: false`, no truncation).
IDLE = {"store": (False, None), "truncation": ("disabled", None), "background": (False, None)}
# Responses state kept at the server: without it the request means something else, so it is refused.
STATEFUL = ("previous_response_id", "conversation", "prompt")


def dicts(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise BadRequest(f"{where} must be a list of objects", where)
    return value


def text_of(parts: Any) -> str:
    """Text content, a string or a list of text parts, as one string."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        return "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
    return ""


def responses_to_chat(body: Body, custom_tools: str = "function") -> tuple[Body, list[str]]:
    """A Responses request as a chat request, and the names of what a chat upstream cannot be given. Custom tools
    go as function tools (`_custom_tools`), or as chat's own custom tools with `custom_tools="native"` (OpenAI's
    chat API takes them, most chat servers do not)."""
    as_function = custom_tools == "function"
    for name in STATEFUL:
        if body.get(name) is not None:
            raise BadRequest(
                f"{name} cannot be carried to a Chat Completions upstream, which keeps no responses; send the whole"
                " conversation in `input` (with store: false)",
                name,
            )
    lost: list[str] = []
    out: Body = {key: body[key] for key in SAME if key in body}
    if "top_logprobs" in out:
        out["logprobs"] = True
    messages: list[Body] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None:
        messages.extend(_input_messages(instructions, "instructions", lost, as_function))
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif items is not None:
        messages.extend(_input_messages(items, "input", lost, as_function))
    out["messages"] = messages
    flat = _flat_tools(body.get("tools", []), lost)
    tools = [tool for tool in (_chat_tool(tool, lost, as_function) for tool in flat) if tool]
    if tools:
        out["tools"] = tools
    if body.get("tool_choice") is not None:
        choice = _chat_tool_choice(body["tool_choice"], lost, as_function)
        if choice is not None and tools:
            out["tool_choice"] = choice
        elif choice not in (None, "auto", "none"):
            named(lost, "tool_choice_dropped")  # no tool left to choose (chat refuses a choice without tools)
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning") or {}
    if isinstance(reasoning, dict):
        if reasoning.get("effort") is not None:
            out["reasoning_effort"] = reasoning["effort"]
        if reasoning.get("summary") is not None or reasoning.get("generate_summary") is not None:
            named(lost, "reasoning_summary_dropped")
    text = body.get("text") or {}
    if isinstance(text, dict):
        if text.get("format") is not None:
            out["response_format"] = _chat_format(text["format"])
        if text.get("verbosity") is not None:
            out["verbosity"] = text["verbosity"]
    if body.get("stream"):
        out["stream_options"] = {"include_usage": True}  # the usage `response.completed` carries
    include = [name for name in body.get("include") or () if name != "message.output_text.logprobs"]
    if include:
        named(lost, "include_dropped")
    known = {
        *SAME,
        *IDLE,
        *STATEFUL,
        "instructions",
        "input",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "reasoning",
        "text",
        "include",
    }
    for key, value in body.items():
        if (key in IDLE and value not in IDLE[key]) or (key not in known and value is not None):
            named(lost, dropped(key))
    return out, lost


def _input_messages(items: Any, where: str, lost: list[str], as_function: bool) -> list[Body]:
    """Input items as chat messages: consecutive tool calls join the assistant message before them (a custom tool's
    call as a function call when `as_function`)."""
    messages: list[Body] = []
    for item in dicts(items, where):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = item.get("content")
            if role == "assistant":
                messages.append({"role": "assistant", "content": _assistant_content(content, lost)})
            else:
                role = "system" if role == "developer" else role  # chat's system and developer mean the same
                text_only = "system_" if role == "system" else ""
                messages.append(
                    {"role": role, "content": _chat_content(content, f"{where}.content", lost, text_only=text_only)}
                )
        elif kind in ("function_call", "custom_tool_call"):
            name = flat_name(item.get("namespace"), item.get("name"))
            if kind == "custom_tool_call" and as_function:
                call = function_call(item.get("call_id"), name, item.get("input", ""))
            elif kind == "function_call":
                call = {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": name, "arguments": item.get("arguments", "")},
                }
            else:
                call = {
                    "id": item.get("call_id"),
                    "type": "custom",
                    "custom": {"name": name, "input": item.get("input", "")},
                }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output", "")
            if not isinstance(output, str):
                output = _chat_content(output, f"{where}.output", lost, text_only="tool_output_")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "reasoning":
            named(lost, "reasoning_item_dropped")  # never sent to a model that did not make it (its encrypted content)
        else:
            named(lost, dropped(kind, "item_dropped"))
    return messages


def _assistant_content(content: Any, lost: list[str]) -> Any:
    """An assistant message's parts as chat content: one string when they are all text (what every chat template
    reads), else text and refusal parts."""
    if isinstance(content, str) or content is None:
        return content
    parts: list[Body] = []
    for part in dicts(content, "input.content"):
        kind = part.get("type")
        if kind in ("output_text", "input_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
            if part.get("annotations"):
                named(lost, "annotations_dropped")
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": part.get("refusal", "")})
        else:
            named(lost, "assistant_" + dropped(kind))
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _chat_content(content: Any, where: str, lost: list[str], *, text_only: str = "") -> Any:
    """Responses content parts as chat parts (`input_text` as `text`, `input_image` as `image_url`, ...)."""
    if isinstance(content, str):
        return content
    parts: list[Body] = []
    for part in dicts(content, where):
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif text_only:
            named(lost, text_only + dropped(kind))  # chat's tool and system messages hold text only
        elif kind == "input_image" and part.get("image_url"):
            image = {"url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_audio":
            parts.append({"type": "input_audio", "input_audio": part.get("input_audio")})
        elif kind == "input_file" and part.get("file_url") is None:
            file = {key: part[key] for key in ("file_data", "file_id", "filename") if part.get(key) is not None}
            parts.append({"type": "file", "file": file})
        else:
            named(lost, "image_file_id_dropped" if kind == "input_image" else dropped(kind, "part_dropped"))
    return parts


NAMESPACED = "__"  # a namespace's tool `name` in `ns` is chat's function `ns__name`


def flat_name(namespace: Any, name: Any) -> Any:
    return f"{namespace}{NAMESPACED}{name}" if isinstance(namespace, str) and namespace else name


def _flat_tools(tools: Any, lost: list[str]) -> list[Body]:
    """The tools, a `namespace` tool's own tools (Codex groups its sub-agent tools so) taken out of it and named
    `NAMESPACE__NAME`: chat has no namespaces, and its function names allow `_`."""
    flat: list[Body] = []
    for tool in dicts(tools, "tools"):
        if tool.get("type") == "namespace":
            namespace = tool.get("name")
            if tool.get("description"):
                named(lost, "namespace_description_dropped")  # chat has no groups of tools to describe
            flat.extend(
                {**inner, "name": flat_name(namespace, inner.get("name"))}
                for inner in dicts(tool.get("tools", []), "tools")
            )
        else:
            flat.append(tool)
    return flat


def namespaces(body: Body) -> dict[str, tuple[str, str]]:
    """The request's namespaced tools: chat's flat name -> (namespace, name), to name the calls back."""
    found: dict[str, tuple[str, str]] = {}
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for inner in tool["tools"]:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found[flat_name(tool.get("name"), inner["name"])] = (str(tool.get("name")), inner["name"])
    return found


def custom_names(body: Body) -> set[str]:
    """The chat function names of the request's custom tools (a namespace's as `NAMESPACE__NAME`)."""
    found: set[str] = set()
    for tool in _flat_tools(body.get("tools") or [], []) if isinstance(body.get("tools"), list) else ():
        if tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            found.add(tool["name"])
    return found


# What chat's function and custom tools hold of a Responses tool; the rest (`defer_loading`, `allowed_callers`,
# `output_schema`, `async`, ...) is named `tool_KEY_dropped` unless it is unset.
_TOOL_KEYS = {"function": ("name", "description", "parameters", "strict"), "custom": ("name", "description")}


def _chat_tool(tool: Body, lost: list[str], as_function: bool) -> Body | None:
    kind = tool.get("type")
    if kind in ("function", "custom"):
        carried = _TOOL_KEYS[kind]
        inner = {key: tool[key] for key in carried if key in tool}
        for key, value in tool.items():
            if key not in (*carried, "type", "format") and value not in (None, False):
                named(lost, "tool_" + dropped(key))
        if kind == "custom" and as_function:
            named(lost, LOSS)
            return function_tool(tool)
        if kind == "custom" and tool.get("format") is not None:
            inner["format"] = _chat_custom_format(tool["format"])
        return {"type": kind, kind: inner}
    named(
        lost, dropped(kind, "tool_dropped")
    )  # built-in tools (web_search, file_search, ...) run at a Responses server only
    return None


def _chat_tool_choice(choice: Any, lost: list[str], as_function: bool) -> Any:
    if isinstance(choice, str):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "custom" and as_function:
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in ("function", "custom"):
        return {"type": kind, kind: {"name": choice.get("name")}}
    if kind == "allowed_tools":
        tools = [_chat_tool_choice(tool, lost, as_function) for tool in choice.get("tools", ())]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": tools}}
    named(lost, "tool_choice_dropped")
    return None


def _chat_custom_format(format_: Any) -> Any:
    """A custom tool's input format in chat's spelling: a grammar's `definition` and `syntax` nested in `grammar`."""
    if isinstance(format_, dict) and format_.get("type") == "grammar":
        return {"type": "grammar", "grammar": {key: format_[key] for key in ("definition", "syntax") if key in format_}}
    return format_


def _chat_format(format_: Any) -> Any:
    if isinstance(format_, dict) and format_.get("type") == "json_schema":
        schema = {key: value for key, value in format_.items() if key != "type"}
        return {"type": "json_schema", "json_schema": schema}
    return format_


def error_body(status: int, body: bytes) -> bytes:
    """An upstream's error in OpenAI's shape, which both APIs share: its `error` object as it came when it has one,
    else the body's text as the message."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and "message" in parsed["error"]:
        error = {"type": "upstream_error", "param": None, "code": None, **parsed["error"]}
    else:
        message = parsed.get("message") if isinstance(parsed, dict) else None
        error = {
            "message": str(message or body.decode("utf-8", "replace") or f"upstream status {status}"),
            "type": "upstream_error",
            "param": None,
            "code": None,
        }
    return json.dumps({"error": error}).encode()
