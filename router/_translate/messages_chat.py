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
import uuid
from typing import Any

from policies import ApiName
from router._apis.chat import CHAT
from router._apis.messages import MESSAGES
from router._translate.base import (
    UNSIGNED,
    Body,
    EventTranslator,
    SseEvent,
    dropped,
    error_message,
    items,
    named,
    obj,
    sse,
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
            content.append({"type": "tool_use", "id": call.get("id") or _tool_id(), "name": function.get("name", ""),
                            "input": _arguments(function.get("arguments"), lost)})  # fmt: skip
        reason, sequence = self.stop_reason(choice)
        answer = {"id": _message_id(body.get("id")), "type": "message", "role": "assistant",
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
        return ChatToMessagesStream(self)

    def error(self, status: int, body: bytes) -> bytes:
        message, _ = error_message(body)
        return MESSAGES.error(status, message, "api_error")


def usage(value: Any) -> Body:
    """Chat's usage as Messages': the prompt's cached tokens are read from the cache, the rest are input."""
    value = value if isinstance(value, dict) else {}
    details = value.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else 0
    prompt = value.get("prompt_tokens")
    out: Body = {"input_tokens": max(0, (prompt if isinstance(prompt, int) else 0) - cached),
                 "output_tokens": value.get("completion_tokens") or 0}  # fmt: skip
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def _message_id(chat_id: Any) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_{uuid.uuid4().hex}"


def _tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


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


class ChatToMessagesStream(EventTranslator):
    """Chat chunks as Messages events: message_start at the first chunk, a content block per run of reasoning
    (thinking), text and each tool call (its arguments as input_json_delta), message_delta and message_stop at the
    end, with the usage of chat's last chunk (`stream_options.include_usage`)."""

    def __init__(self, owner: MessagesOverChat) -> None:
        super().__init__()
        self.owner = owner
        self.started = self.ended = False
        self.block: tuple[str, int] | None = None  # the open block: its kind ("thinking", "text", "tool:N")
        self.index = -1
        self.reason: tuple[str | None, str | None] = (None, None)
        self.usage: Body = {"input_tokens": 0, "output_tokens": 0}

    def event(self, event: SseEvent) -> bytes:
        if event.data.strip() == "[DONE]":
            return self.end()
        chunk = event.json()
        if not isinstance(chunk, dict):
            return b""
        if "error" in chunk:
            message, _ = error_message(event.data.encode())
            return self.close() + self.error(message)
        out = b"" if self.started else self.start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = usage(chunk["usage"])
        for choice in items(chunk.get("choices")):
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self.delta(choice)
        return out

    def start(self, chunk: Body) -> bytes:
        self.started = True
        message = {"id": _message_id(chunk.get("id")), "type": "message", "role": "assistant",
                   "model": chunk.get("model", ""), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
        return sse({"type": "message_start", "message": message}, "message_start")

    def delta(self, choice: Body) -> bytes:
        out = b""
        delta = obj(choice.get("delta"))
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out += self.open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out += self.piece({"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self.open("text", {"type": "text", "text": ""})
            out += self.piece({"type": "text_delta", "text": text})
        for call in items(delta.get("tool_calls")):
            if not isinstance(call, dict):
                continue
            function = obj(call.get("function"))
            kind = f"tool:{call.get('index', 0)}"
            if self.block is None or self.block[0] != kind:
                out += self.open(kind, {"type": "tool_use", "id": call.get("id") or _tool_id(),
                                        "name": function.get("name") or "", "input": {}})  # fmt: skip
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out += self.piece({"type": "input_json_delta", "partial_json": arguments})
        if choice.get("finish_reason") is not None:
            self.reason = self.owner.stop_reason(choice)
            out += self.close()
        return out

    def open(self, kind: str, block: Body) -> bytes:
        if self.block is not None and self.block[0] == kind:
            return b""
        out = self.close()
        self.index += 1
        self.block = (kind, self.index)
        return out + sse({"type": "content_block_start", "index": self.index, "content_block": block},
                         "content_block_start")  # fmt: skip

    def piece(self, delta: Body) -> bytes:
        return sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta")

    def close(self) -> bytes:
        if self.block is None:
            return b""
        out = b""
        if self.block[0] == "thinking":  # marked as made by no model: never sent on (base.UNSIGNED)
            out = self.piece({"type": "signature_delta", "signature": UNSIGNED})
        self.block = None
        return out + sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")

    def end(self) -> bytes:
        if self.ended or not self.started:
            return b""
        self.ended = True
        reason, sequence = self.reason
        delta = {"type": "message_delta", "delta": {"stop_reason": reason or "end_turn", "stop_sequence": sequence},
                 "usage": self.usage}  # fmt: skip
        return self.close() + sse(delta, "message_delta") + sse({"type": "message_stop"}, "message_stop")

    def error(self, message: str) -> bytes:
        self.ended = True
        return MESSAGES.stream_error(message)
