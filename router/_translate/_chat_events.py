"""Chat Completions chunks as Anthropic Messages events (router/_translate/messages_chat.py's stream), and the
parts a Messages answer made from chat's shares with it: its usage and ids."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from router._apis.messages import MESSAGES
from router._translate.base import UNSIGNED, Body, EventTranslator, SseEvent, error_message, items, obj, sse

StopReason = Callable[[Body], tuple[str | None, str | None]]


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


def message_id(chat_id: Any) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_{uuid.uuid4().hex}"


def tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


class ChatToMessagesStream(EventTranslator):
    """Chat chunks as Messages events: message_start at the first chunk, a content block per run of reasoning
    (thinking), text and each tool call (its arguments as input_json_delta), message_delta and message_stop at the
    end, with the usage of chat's last chunk (`stream_options.include_usage`)."""

    def __init__(self, stop_reason: StopReason) -> None:
        super().__init__()
        self.stop_reason = stop_reason
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
        message = {"id": message_id(chunk.get("id")), "type": "message", "role": "assistant",
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
                out += self.open(kind, {"type": "tool_use", "id": call.get("id") or tool_id(),
                                        "name": function.get("name") or "", "input": {}})  # fmt: skip
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out += self.piece({"type": "input_json_delta", "partial_json": arguments})
        if choice.get("finish_reason") is not None:
            self.reason = self.stop_reason(choice)
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
