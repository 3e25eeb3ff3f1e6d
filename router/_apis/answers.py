"""What an upstream answered, read for an answer guard (issue 27), and the answer that replaces a withheld one: per
client API, for JSON answers and for event streams read whole.

    >>> read_answer("chat", b'{"choices": [{"message": {"content": "hi"}}]}', streamed=False).text
    'hi'

A table keyed by the API's name: each reader knows one API's answer shape; nothing else here asks which API it is.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from router._asgi import sse


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call the answer proposes: its tool's name and its arguments as the model wrote them."""

    name: str
    arguments: str


@dataclass(slots=True)
class Answered:
    """The text and the tool calls of one answer (every choice's, in order)."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)


def read_answer(api: str, raw: bytes, *, streamed: bool) -> Answered:
    """The answer's text and tool calls; a body that is not the API's answer reads as empty (the guard then judges
    an empty answer, which is what the client would get)."""
    if streamed:  # followed event by event, as the windows of a stream are (FOLLOWERS, below)
        seen = Followed()
        for event in events(raw):
            FOLLOWERS[api](event, seen)
        seen.close_all()
        return Answered(seen.text, seen.done)
    try:
        body = json.loads(raw)
    except ValueError:
        return Answered()
    return JSON_READERS[api](body) if isinstance(body, dict) else Answered()


def events(raw: bytes) -> Iterator[dict[str, Any]]:
    """The JSON `data:` of each server-sent event (`[DONE]` and anything not JSON skipped)."""
    for event in sse.events(raw):
        data = sse.json_data(event)
        if data is not None:
            yield data


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    """Content as text: a string, or the text of its parts."""
    if isinstance(value, str):
        return value
    return "".join(str(part.get("text", "")) for part in _dicts(value))


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# --- JSON answers -----------------------------------------------------------------------------------------------
def _chat(body: dict[str, Any]) -> Answered:
    out = Answered()
    for choice in _dicts(body.get("choices")):
        message = _dict(choice.get("message"))
        out.text += _text(message.get("content"))
        for call in _dicts(message.get("tool_calls")):
            function = _dict(call.get("function"))
            out.calls.append(Call(str(function.get("name", "")), _arguments(function.get("arguments", ""))))
    return out


def _completions(body: dict[str, Any]) -> Answered:
    return Answered("".join(str(choice.get("text", "")) for choice in _dicts(body.get("choices"))))


def _responses(body: dict[str, Any]) -> Answered:
    out = Answered()
    for item in _dicts(body.get("output")):
        kind = item.get("type")
        if kind == "message":
            out.text += _text(item.get("content"))
        elif kind in ("function_call", "custom_tool_call"):
            out.calls.append(Call(str(item.get("name", "")), _arguments(item.get("arguments", item.get("input", "")))))
        elif kind == "local_shell_call":
            out.calls.append(Call("local_shell", _arguments(item.get("action", {}))))
    return out


def _messages(body: dict[str, Any]) -> Answered:
    out = Answered()
    for block in _dicts(body.get("content")):
        if block.get("type") == "text":
            out.text += str(block.get("text", ""))
        elif block.get("type") in ("tool_use", "server_tool_use"):
            out.calls.append(Call(str(block.get("name", "")), _arguments(block.get("input", {}))))
    return out


JSON_READERS: dict[str, Callable[[dict[str, Any]], Answered]] = {
    "chat": _chat, "completions": _completions, "responses": _responses, "messages": _messages,
}  # fmt: skip


# --- the answer that replaces a withheld one ---------------------------------------------------------------------
def replacement(api: str, text: str, model: str, *, streamed: bool) -> tuple[bytes, bytes]:
    """An answer in `api`'s shape saying `text` and ending normally (no tool call), and its content type."""
    if streamed:
        return b"".join(_sse(event) for event in STREAMS[api](text, model)), b"text/event-stream"
    return json.dumps(BODIES[api](text, model)).encode(), b"application/json"


def _sse(event: dict[str, Any] | str) -> bytes:
    if isinstance(event, str):
        return f"data: {event}\n\n".encode()
    name = event.get("type")
    head = f"event: {name}\n" if (isinstance(name, str) and "." in name) or name in _MESSAGE_EVENTS else ""
    return f"{head}data: {json.dumps(event)}\n\n".encode()


_MESSAGE_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                   "message_delta", "message_stop"}  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _chat_body(text: str, model: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {"id": _id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip


def _completions_body(text: str, model: str) -> dict[str, Any]:
    return {"id": _id("cmpl-"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}  # fmt: skip


def _message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": _id("msg_"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _responses_body(text: str, model: str) -> dict[str, Any]:
    return {"id": _id("resp_"), "object": "response", "created_at": int(time.time()), "model": model,
            "status": "completed", "output": [_message_item(text)]}  # fmt: skip


def _messages_body(text: str, model: str) -> dict[str, Any]:
    return {"id": _id("msg_"), "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip


BODIES: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "chat": _chat_body, "completions": _completions_body, "responses": _responses_body, "messages": _messages_body,
}  # fmt: skip


def _chat_stream_events(text: str, model: str) -> list[dict[str, Any] | str]:
    head = {"id": _id("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    return [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        "[DONE]",
    ]


def _completions_stream_events(text: str, model: str) -> list[dict[str, Any] | str]:
    head = {"id": _id("cmpl-"), "object": "text_completion", "created": int(time.time()), "model": model}
    return [{**head, "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}, "[DONE]"]


def _responses_stream_events(text: str, model: str) -> list[dict[str, Any] | str]:
    done = _responses_body(text, model)
    started = {**done, "status": "in_progress", "output": []}
    item = done["output"][0]
    part = item["content"][0]
    return [
        {"type": "response.created", "sequence_number": 0, "response": started},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
         "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", "sequence_number": 2, "item_id": item["id"], "output_index": 0,
         "content_index": 0, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", "sequence_number": 3, "item_id": item["id"], "output_index": 0,
         "content_index": 0, "delta": text},
        {"type": "response.output_text.done", "sequence_number": 4, "item_id": item["id"], "output_index": 0,
         "content_index": 0, "text": text},
        {"type": "response.content_part.done", "sequence_number": 5, "item_id": item["id"], "output_index": 0,
         "content_index": 0, "part": part},
        {"type": "response.output_item.done", "sequence_number": 6, "output_index": 0, "item": item},
        {"type": "response.completed", "sequence_number": 7, "response": done},
    ]  # fmt: skip


def _messages_stream_events(text: str, model: str) -> list[dict[str, Any] | str]:
    start = {**_messages_body("", model), "content": [], "stop_reason": None}
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 0}},
        {"type": "message_stop"},
    ]  # fmt: skip


STREAMS: dict[str, Callable[[str, str], list[dict[str, Any] | str]]] = {
    "chat": _chat_stream_events, "completions": _completions_stream_events, "responses": _responses_stream_events,
    "messages": _messages_stream_events,
}  # fmt: skip


# --- streams, followed event by event (answer guards' windows) ------------------------------------------------------
@dataclass(slots=True)
class Followed:
    """What a stream said since the last window: new text, tool calls still streaming, tool calls complete."""

    text: str = ""
    open: dict[Any, list[str]] = field(default_factory=dict)  # key -> [name, arguments so far]
    done: list[Call] = field(default_factory=list)

    def close(self, key: Any) -> None:
        if key in self.open:
            name, arguments = self.open.pop(key)
            self.done.append(Call(name, arguments))

    def close_all(self) -> None:
        for key in list(self.open):
            self.close(key)


def _follow_chat(event: dict[str, Any], seen: Followed) -> None:
    for choice in _dicts(event.get("choices")):
        delta = _dict(choice.get("delta"))
        seen.text += _text(delta.get("content") or "")
        for call in _dicts(delta.get("tool_calls")):
            key = (int(choice.get("index", 0) or 0), int(call.get("index", 0) or 0))
            function = _dict(call.get("function"))
            name, arguments = seen.open.setdefault(key, ["", ""])
            seen.open[key] = [name + str(function.get("name") or ""), arguments + str(function.get("arguments") or "")]
        if choice.get("finish_reason"):
            for key in [k for k in seen.open if k[0] == int(choice.get("index", 0) or 0)]:
                seen.close(key)


def _follow_completions(event: dict[str, Any], seen: Followed) -> None:
    seen.text += "".join(str(choice.get("text", "")) for choice in _dicts(event.get("choices")))


def _follow_responses(event: dict[str, Any], seen: Followed) -> None:
    kind, index = event.get("type"), event.get("output_index")
    if kind == "response.output_text.delta":
        seen.text += str(event.get("delta", ""))
    elif kind == "response.output_item.added":
        item = _dict(event.get("item"))
        if item.get("type") != "message":
            seen.open[index] = [str(item.get("name", item.get("type", ""))), ""]
    elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
        if index in seen.open:
            seen.open[index][1] += str(event.get("delta", ""))
    elif kind == "response.output_item.done":
        item = _dict(event.get("item"))
        if item.get("type") != "message":
            seen.open.pop(index, None)
            seen.done.extend(_responses({"output": [item]}).calls)  # the item whole: what the client will run


def _follow_messages(event: dict[str, Any], seen: Followed) -> None:
    kind, index = event.get("type"), event.get("index")
    if kind == "content_block_start":
        block = _dict(event.get("content_block"))
        if block.get("type") == "text":
            seen.text += str(block.get("text", ""))
        elif block.get("type") in ("tool_use", "server_tool_use"):
            seen.open[index] = [str(block.get("name", "")), ""]
    elif kind == "content_block_delta":
        delta = _dict(event.get("delta"))
        if delta.get("type") == "text_delta":
            seen.text += str(delta.get("text", ""))
        elif delta.get("type") == "input_json_delta" and index in seen.open:
            seen.open[index][1] += str(delta.get("partial_json", ""))
    elif kind == "content_block_stop":
        seen.close(index)


FOLLOWERS: dict[str, Callable[[dict[str, Any], Followed], None]] = {
    "chat": _follow_chat, "completions": _follow_completions, "responses": _follow_responses,
    "messages": _follow_messages,
}  # fmt: skip
