"""Anthropic Messages clients (Claude Code, the `anthropic` SDK) carried by a Chat Completions upstream.

    tr = translation("messages", "chat")
    chat_body, lost = tr.request(messages_body)   # system -> a system message, blocks -> parts, tool_use -> tool_calls
    message, lost = tr.answer(chat_completion)    # choices[0] -> content blocks, finish_reason -> stop_reason

What chat cannot hold is named (docs/translation.md): a thinking block (its text and, above all, its signature: a
signature is never sent to a model that did not make it), cache_control, documents, server tools, top_k. One
instance serves one request: the answer's `stop_sequence` is told from the request's stop sequences.
"""

from __future__ import annotations

import json
from typing import Any

from policies import ApiName
from router._apis.chat import CHAT
from router._apis.messages import MESSAGES
from router._translate._chat_events import ChatToMessagesStream, message_id, tool_id, usage
from router._translate.base import (
    UNSIGNED,
    Body,
    dropped,
    error_message,
    items,
    named,
    obj,
)
from router._translate.registry import pair

# A thinking budget as chat's reasoning effort: up to 4k tokens is low, up to 16k medium, more high.
EFFORT_BUDGETS = ((4096, "low"), (16384, "medium"))
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}  # fmt: skip
# Messages' fields with nothing in chat to carry them: dropped, and named.
_UNCARRIED = {"top_k": "top_k_dropped", "service_tier": "service_tier_dropped", "container": "container_dropped",
              "mcp_servers": "mcp_servers_dropped", "context_management": "context_management_dropped"}  # fmt: skip


def effort(budget: Any) -> str:
    """A thinking budget's reasoning effort."""
    if not isinstance(budget, int):
        return "medium"
    return next((name for limit, name in EFFORT_BUDGETS if budget <= limit), "high")


@pair("messages", "chat")
class MessagesOverChat:
    client: ApiName = "messages"
    upstream: ApiName = "chat"
    upstream_path = CHAT.upstream_path

    def __init__(self) -> None:
        self.stops: list[str] = []

    # --- the request ----------------------------------------------------------------------------------------------
    def request(self, body: Body) -> tuple[Body, list[str]]:
        lost: list[str] = []
        out: Body = {"model": body.get("model")}
        messages: list[Body] = []
        system = body.get("system")
        if system is not None:
            messages.append({"role": "system", "content": _text(system, lost)})
        for message in items(body.get("messages")):
            if isinstance(message, dict):
                messages.extend(_message(message, lost))
        out["messages"] = messages
        for name in ("max_tokens", "temperature", "top_p", "stream"):
            if name in body:
                out[name] = body[name]
        if body.get("stream"):
            out["stream_options"] = {"include_usage": True}  # the usage Messages' message_delta carries
        stops = body.get("stop_sequences")
        if isinstance(stops, list) and stops:
            self.stops = [stop for stop in stops if isinstance(stop, str)]
            out["stop"] = self.stops
        tools = [_tool(tool, lost) for tool in items(body.get("tools")) if isinstance(tool, dict)]
        if any(tools):
            out["tools"] = [tool for tool in tools if tool]
        _tool_choice(body.get("tool_choice"), out, lost)
        found = body.get("output_config")
        config: Body = found if isinstance(found, dict) else {}
        thinking = body.get("thinking")
        if isinstance(config.get("effort"), str):
            out["reasoning_effort"] = config["effort"]
        elif isinstance(thinking, dict) and thinking.get("type") == "enabled":
            out["reasoning_effort"] = effort(thinking.get("budget_tokens"))
        elif isinstance(thinking, dict) and thinking.get("type") == "disabled":
            out["reasoning_effort"] = "none"
        metadata = body.get("metadata")
        if isinstance(metadata, dict):
            if isinstance(metadata.get("user_id"), str):
                out["user"] = metadata["user_id"]
            if set(metadata) - {"user_id"}:
                named(lost, "metadata_dropped")
        output = config.get("format") or body.get("output_format")  # output_format: the beta's name
        if isinstance(output, dict) and output.get("type") == "json_schema":
            schema = {"name": "output", "schema": obj(output.get("schema"))}
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        for name, loss in _UNCARRIED.items():
            if body.get(name) is not None:
                named(lost, loss)
        return out, lost

    # --- the answer -----------------------------------------------------------------------------------------------
    def answer(self, body: Body) -> tuple[Body, list[str]]:
        lost: list[str] = []
        choices = items(body.get("choices")) or [{}]
        if len(choices) > 1:
            named(lost, "choices_dropped")
        choice = obj(choices[0])
        message = obj(choice.get("message"))
        content: list[Body] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": UNSIGNED})
        text = message.get("content")
        if isinstance(text, str) and text:
            content.append({"type": "text", "text": text})
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal:
            content.append({"type": "text", "text": refusal})
        for call in items(message.get("tool_calls")):
            if not isinstance(call, dict):
                continue
            function = obj(call.get("function"))
            content.append({"type": "tool_use", "id": call.get("id") or tool_id(), "name": function.get("name", ""),
                            "input": _arguments(function.get("arguments"), lost)})  # fmt: skip
        reason, sequence = self.stop_reason(choice)
        answer = {"id": message_id(body.get("id")), "type": "message", "role": "assistant",
                  "model": body.get("model", ""), "content": content, "stop_reason": reason,
                  "stop_sequence": sequence, "usage": usage(body.get("usage"))}  # fmt: skip
        return answer, lost

    def stop_reason(self, choice: Body) -> tuple[str | None, str | None]:
        finish = choice.get("finish_reason")
        if finish is None:
            return None, None
        matched = choice.get("stop_reason")  # vLLM names the stop string that ended the text
        if finish == "stop" and isinstance(matched, str) and matched in self.stops:
            return "stop_sequence", matched
        return STOP_REASONS.get(finish, "end_turn"), None

    def stream(self) -> ChatToMessagesStream:
        return ChatToMessagesStream(self.stop_reason)

    def error(self, status: int, body: bytes) -> bytes:
        message, _ = error_message(body)
        return MESSAGES.error(status, message, "api_error")


def _arguments(value: Any, lost: list[str]) -> Any:
    """A tool call's arguments (a JSON text) as the tool_use block's input (an object)."""
    if not isinstance(value, str) or not value.strip():
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        named(lost, "tool_arguments_unparsable")
        return {}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _cache(block: Body, lost: list[str]) -> None:
    if block.get("cache_control") is not None:
        named(lost, "cache_control_dropped")


def _text(value: Any, lost: list[str]) -> str:
    """A string or text blocks as one text (system prompts, tool results)."""
    if isinstance(value, str):
        return value
    texts = []
    for block in value if isinstance(value, list) else ():
        if isinstance(block, dict):
            _cache(block, lost)
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            else:
                named(lost, dropped(block.get("type")))
    return "\n".join(texts)


def _image(source: Any, lost: list[str]) -> Body | None:
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        named(lost, "image_source_dropped")  # a file id: nothing a chat upstream can fetch
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _message(message: Body, lost: list[str]) -> list[Body]:
    """One Messages message as chat messages: its tool results first (each a `tool` message), then its own."""
    role = message.get("role")
    content = message.get("content")
    if role == "system":
        return [{"role": "system", "content": _text(content, lost)}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts: list[Body] = []
    calls: list[Body] = []
    results: list[Body] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        _cache(block, lost)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            image = _image(block.get("source"), lost)
            if image is not None:
                parts.append(image)
        elif kind == "tool_use":
            arguments = json.dumps(obj(block.get("input")), ensure_ascii=False)
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": arguments}})  # fmt: skip
        elif kind == "tool_result":
            results.append(_result(block, lost))
        elif kind == "thinking":
            # Chat has no place for a thinking block, and its signature is the Anthropic model's own: never sent
            # to another model ("Invalid signature in thinking block").
            named(lost, "thinking_dropped")
            if block.get("signature") and block.get("signature") != UNSIGNED:
                named(lost, "thinking_signature_dropped")
        elif kind == "redacted_thinking":
            named(lost, "redacted_thinking_dropped")
        else:  # documents, search results, server tools' blocks
            named(lost, dropped(kind))
    out = list(results)
    if role == "assistant":
        text = "\n".join(part["text"] for part in parts if part["type"] == "text")
        if any(part["type"] != "text" for part in parts):
            named(lost, "assistant_image_dropped")
        if text or calls:
            out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
    elif parts or not results:
        plain = all(part["type"] == "text" for part in parts)
        out.append({"role": role, "content": "\n".join(p["text"] for p in parts) if plain else parts})
    return out


def _result(block: Body, lost: list[str]) -> Body:
    inner = block.get("content")
    if isinstance(inner, list):
        if any(isinstance(part, dict) and part.get("type") == "image" for part in inner):
            named(lost, "tool_result_image_dropped")
        inner = [part for part in inner if not (isinstance(part, dict) and part.get("type") == "image")]
    text = _text(inner if inner is not None else "", lost)
    if block.get("is_error"):
        named(lost, "tool_result_is_error_dropped")
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}


def _tool(tool: Body, lost: list[str]) -> Body | None:
    if "input_schema" not in tool or tool.get("type") not in (None, "custom"):
        named(lost, "server_tool_dropped")  # bash, web search, the text editor: run by Anthropic, not a function
        return None
    _cache(tool, lost)
    function: Body = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, out: Body, lost: list[str]) -> None:
    if not isinstance(choice, dict):
        return
    kind = choice.get("type")
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("disable_parallel_tool_use") and "tools" in out:
        out["parallel_tool_calls"] = False
