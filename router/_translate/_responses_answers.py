"""The Responses API <-> Chat Completions pair (issue 30.1): whole answers, both ways.

    response, lost = chat_to_response(completion, asked)   # a chat completion as a Responses `response`
    completion, lost = response_to_chat(response)           # a `response` as a chat completion

`asked` is the client's Responses request: a `response` echoes its instructions, tools and parameters, as a
Responses server's does. Usage is carried (input/output tokens, cached and reasoning tokens), the finish reason
becomes the status (`length` is `incomplete` for `max_output_tokens`, `content_filter` `incomplete` for
`content_filter`) and back; a chat model's `reasoning_content` is a reasoning item with its text, and a reasoning
item's text `reasoning_content` (its `encrypted_content`, which only its own model can read, is named and left out).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping
from typing import Any

from router._translate._custom_tools import input_of
from router._translate._responses_requests import custom_names, flat_name, namespaces
from router._translate.base import Body, dropped, named

Spaces = Mapping[str, tuple[str, str]] | None

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
FINISHED = {reason: finish for finish, reason in INCOMPLETE.items()}
# The request's fields a `response` repeats, with the Responses API's defaults.
ECHOED: dict[str, Any] = {
    "instructions": None,
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "temperature": None,
    "top_p": None,
    "max_output_tokens": None,
    "metadata": None,
    "text": None,
    "reasoning": None,
    "top_logprobs": None,
    "user": None,
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def echoed(asked: Body | None) -> Body:
    """The request's fields a `response` repeats (its defaults when the request left them out)."""
    asked = asked or {}
    out = {key: asked.get(key, default) for key, default in ECHOED.items()}
    if out["tool_choice"] is None:
        out["tool_choice"] = "auto"
    if out["parallel_tool_calls"] is None:
        out["parallel_tool_calls"] = True
    if out["tools"] is None:
        out["tools"] = []
    return out


def response_usage(usage: Any) -> Body | None:
    """Chat usage as a `response`'s."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    details = usage.get("prompt_tokens_details") or {}
    cached, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def chat_usage(usage: Any) -> Body | None:
    """A `response`'s usage as chat's."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("input_tokens") or 0
    completion = usage.get("output_tokens") or 0
    details = usage.get("input_tokens_details") or {}
    cached, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": usage.get("total_tokens") or prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def status_of(finish_reason: Any) -> tuple[str, Body | None]:
    """A chat finish reason as a `response`'s status and incomplete details."""
    reason = INCOMPLETE.get(str(finish_reason))
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def finish_of(response: Body, calls: bool) -> str:
    """A `response`'s status as a chat finish reason."""
    if response.get("status") == "incomplete":
        return FINISHED.get(str((response.get("incomplete_details") or {}).get("reason")), "length")
    return "tool_calls" if calls else "stop"


def reasoning_text(message: Body) -> str | None:
    """A chat model's reasoning (`reasoning_content`, or `reasoning` as newer vLLM spells it)."""
    text = message.get("reasoning_content") or message.get("reasoning")
    return text if isinstance(text, str) and text else None


def reasoning_item(text: str, item_id: str | None = None) -> Body:
    return {
        "id": item_id or new_id("rs"),
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def call_item(
    call: Body,
    item_id: str | None = None,
    status: str = "completed",
    spaces: Spaces = None,
    custom: Collection[str] = (),
) -> Body:
    """A chat tool call as a `function_call` (or `custom_tool_call`) output item; a flat name of a namespaced tool
    (`spaces`, from the request) is its namespace and name again; a function call of one of the request's custom
    tools (`custom`: they went to chat as function tools) is a `custom_tool_call` with its `input` argument."""
    function = call.get("function")
    if call.get("type", "function") == "function" and isinstance(function, dict) and function.get("name") in custom:
        input_ = input_of(str(function.get("arguments") or ""))
        call = {"id": call.get("id"), "type": "custom", "custom": {"name": function["name"], "input": input_}}
    item = _call_item(call, item_id, status)
    if spaces and item["name"] in spaces:
        item["namespace"], item["name"] = spaces[item["name"]]
    return item


def _call_item(call: Body, item_id: str | None, status: str) -> Body:
    if call.get("type") == "custom":
        custom = call.get("custom") or {}
        return {
            "id": item_id or new_id("ctc"),
            "type": "custom_tool_call",
            "call_id": call.get("id") or "",
            "name": custom.get("name") or "",
            "input": custom.get("input") or "",
            "status": status,
        }
    function = call.get("function") or {}
    return {
        "id": item_id or new_id("fc"),
        "type": "function_call",
        "call_id": call.get("id") or "",
        "name": function.get("name") or "",
        "arguments": function.get("arguments") or "",
        "status": status,
    }


def chat_to_response(answer: Body, asked: Body | None = None, custom_tools: str = "function") -> tuple[Body, list[str]]:
    """A chat completion as a Responses `response`; only the first choice is carried (`choices` named otherwise).
    With `custom_tools="function"` (the request's custom tools went as function tools), a call of one is a
    `custom_tool_call` again."""
    lost: list[str] = []
    choices = [choice for choice in answer.get("choices") or () if isinstance(choice, dict)]
    if len(choices) > 1:
        lost.append("choices_dropped")
    choice = choices[0] if choices else {}
    message = choice.get("message") or {}
    output: list[Body] = []
    thought = reasoning_text(message)
    if thought:
        output.append(reasoning_item(thought))
    parts: list[Body] = []
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if content:
        text: Body = {"type": "output_text", "text": content, "annotations": []}
        logprobs = (choice.get("logprobs") or {}).get("content")
        if logprobs:
            text["logprobs"] = logprobs
        parts.append(text)
    if message.get("refusal"):
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        output.append(
            {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "completed", "content": parts}
        )
    spaces = namespaces(asked or {})
    custom = custom_names(asked or {}) if custom_tools == "function" else set()
    calls = [call for call in message.get("tool_calls") or () if isinstance(call, dict)]
    output.extend(call_item(call, spaces=spaces, custom=custom) for call in calls)
    status, incomplete = status_of(choice.get("finish_reason"))
    response = {
        "id": new_id("resp"),
        "object": "response",
        "created_at": answer.get("created") or int(time.time()),
        "model": answer.get("model") or "",
        "status": status,
        "incomplete_details": incomplete,
        "error": None,
        "output": output,
        "usage": response_usage(answer.get("usage")),
        **echoed(asked),
    }
    return response, lost


def response_to_chat(response: Body) -> tuple[Body, list[str]]:
    """A Responses `response` as a chat completion: its messages' text, its tool calls, its reasoning text."""
    lost: list[str] = []
    text: list[str] = []
    refusal: list[str] = []
    thought: list[str] = []
    calls: list[Body] = []
    logprobs: list[Any] = []
    for item in response.get("output") or ():
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    text.append(part.get("text") or "")
                    logprobs.extend(part.get("logprobs") or ())
                elif part.get("type") == "refusal":
                    refusal.append(part.get("refusal") or "")
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {
                        "name": flat_name(item.get("namespace"), item.get("name")),
                        "arguments": item.get("arguments") or "",
                    },
                }
            )
        elif kind == "custom_tool_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "custom",
                    "custom": {
                        "name": flat_name(item.get("namespace"), item.get("name")),
                        "input": item.get("input") or "",
                    },
                }
            )
        elif kind == "reasoning":
            texts = [part.get("text") or "" for part in item.get("content") or item.get("summary") or ()]
            thought.append("".join(texts))
            if item.get("encrypted_content"):
                named(lost, "reasoning_encrypted_content_dropped")
        else:
            named(lost, dropped(kind))
    message: Body = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if refusal:
        message["refusal"] = "".join(refusal)
    if calls:
        message["tool_calls"] = calls
    if any(thought):
        message["reasoning_content"] = "".join(thought)
    choice: Body = {
        "index": 0,
        "message": message,
        "finish_reason": finish_of(response, bool(calls)),
        "logprobs": {"content": logprobs} if logprobs else None,
    }
    if response.get("status") in ("failed", "cancelled"):
        named(lost, f"{response['status']}_status_dropped")
    completion = {
        "id": response.get("id") or new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(response.get("created_at") or time.time()),
        "model": response.get("model") or "",
        "choices": [choice],
        "usage": chat_usage(response.get("usage")),
    }
    return completion, lost
