"""The Responses API <-> Chat Completions pair (issue 30.1): streams, event by event, both ways.

    stream = ResponsesFromChat(asked)          # a chat upstream's chunks -> Responses events for the client
    out = stream.feed(raw_bytes) ; ... ; out += stream.flush()
    stream = ChatFromResponses(include_usage)  # a Responses upstream's events -> chat chunks for the client

Each `feed` answers at once with what the event makes (possibly nothing), never holding the stream back: a chat
chunk's text is an `output_text.delta` as soon as it comes. A Responses stream starts with `response.created` and
`response.in_progress`; each output item is opened (`output_item.added`, `content_part.added`), filled
(`output_text.delta`, `reasoning_text.delta`, `refusal.delta`, `function_call_arguments.delta`, and
`custom_tool_call_input.delta` for a custom tool's call made as a function's, its `input` decoded as it comes by
`_custom_tools.InputStream`) and closed (`.done` events, `output_item.done`) in order, and the stream ends with
`response.completed` (or `response.incomplete`) carrying the whole response and its usage: at the chunk that brings
the usage, else at `flush` (the upstream's end).
"""

from __future__ import annotations

import time
from typing import Any

from router._translate._custom_tools import InputStream
from router._translate._responses_answers import (
    call_item,
    chat_usage,
    echoed,
    finish_of,
    new_id,
    response_usage,
    status_of,
)
from router._translate._responses_requests import custom_names, flat_name, namespaces
from router._translate.base import Body, EventTranslator, SseEvent, dropped, sse


class ResponsesFromChat(EventTranslator):
    """A chat upstream's stream as the Responses events its client expects."""

    def __init__(self, asked: Body | None = None, custom_tools: str = "function") -> None:
        super().__init__()
        self.asked = asked
        self.spaces = namespaces(asked or {})
        self.custom = custom_names(asked or {}) if custom_tools == "function" else set()
        # output index -> the input of a custom tool's call, made as a function's
        self.inputs: dict[int, InputStream] = {}
        self.sequence = 0
        self.response: Body | None = None
        self.output: list[Body] = []  # the items as they stand, in output order
        self.texts: dict[int, list[str]] = {}  # an open item's text so far: output index -> pieces
        self.open: int | None = None  # the open message or reasoning item's output index
        self.calls: dict[int, int] = {}  # chat tool-call index -> output index
        self.finish: Any = None
        self.usage: Body | None = None
        self.ended = False

    def _event(self, type_: str, **fields: Any) -> bytes:
        event = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(event, type_)

    def _start(self, chunk: Body) -> bytes:
        self.response = {
            "id": new_id("resp"),
            "object": "response",
            "created_at": chunk.get("created") or int(time.time()),
            "model": chunk.get("model") or "",
            "status": "in_progress",
            "incomplete_details": None,
            "error": None,
            "output": [],
            "usage": None,
            **echoed(self.asked),
        }
        return self._event("response.created", response=dict(self.response)) + self._event(
            "response.in_progress", response=dict(self.response)
        )

    def event(self, event: SseEvent) -> bytes:
        """The Responses events one chat chunk makes (`[DONE]` ends the response; a chunk holding an `error` ends
        the stream with `error`)."""
        if self.ended:
            return b""
        if event.data.strip() == "[DONE]":
            return self.end()
        chunk = event.json()
        if not isinstance(chunk, dict):
            return b""
        if isinstance(chunk.get("error"), dict):
            return self.error(str(chunk["error"].get("message") or "upstream error"))
        out = b"" if self.response is not None else self._start(chunk)
        choices = [choice for choice in chunk.get("choices") or () if isinstance(choice, dict)]
        if any(choice.get("index", 0) != 0 for choice in choices):
            self.lose("choices_dropped")
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                out += self._text("reasoning", "reasoning_text", thought)
            if delta.get("content"):
                logprobs = (choice.get("logprobs") or {}).get("content") or []
                out += self._text("message", "output_text", delta["content"], logprobs)
            if delta.get("refusal"):
                out += self._text("message", "refusal", delta["refusal"])
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            out += self.end()  # the usage comes last: the response is whole
        return out

    def _text(self, kind: str, part: str, delta: str, logprobs: list[Any] | None = None) -> bytes:
        out = b""
        item = self.output[self.open] if self.open is not None else None
        if item is None or item["type"] != kind:
            out += self._close_open()
            item_id = new_id("rs" if kind == "reasoning" else "msg")
            item = (
                {"id": item_id, "type": "reasoning", "summary": [], "status": "in_progress"}
                if kind == "reasoning"
                else {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            )
            self.open = len(self.output)
            self.output.append(item)
            out += self._event("response.output_item.added", output_index=self.open, item=dict(item, content=[]))
        index = self.open if self.open is not None else len(self.output) - 1
        parts = item.setdefault("content", [])
        if not parts or parts[-1]["type"] != part:
            out += self._close_part(index)
            parts.append(_part(part, ""))
            self.texts[index] = []
            out += self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=len(parts) - 1,
                part=_part(part, ""),
            )
        self.texts[index].append(delta)
        where = {"item_id": item["id"], "output_index": index, "content_index": len(parts) - 1}
        if part == "output_text":
            parts[-1]["logprobs"].extend(logprobs or ())
            return out + self._event("response.output_text.delta", **where, delta=delta, logprobs=logprobs or [])
        return out + self._event(f"response.{part}.delta", **where, delta=delta)

    def _close_part(self, index: int) -> bytes:
        """Ends the open item's last part (`output_text.done`, ..., `content_part.done`)."""
        item = self.output[index]
        parts = item.get("content") or []
        pieces = self.texts.pop(index, None)
        if not parts or pieces is None:
            return b""
        part = parts[-1]
        text = "".join(pieces)
        part["refusal" if part["type"] == "refusal" else "text"] = text
        where = {"item_id": item["id"], "output_index": index, "content_index": len(parts) - 1}
        if part["type"] == "output_text":
            done = self._event("response.output_text.done", **where, text=text, logprobs=part["logprobs"])
        elif part["type"] == "refusal":
            done = self._event("response.refusal.done", **where, refusal=text)
        else:
            done = self._event("response.reasoning_text.done", **where, text=text)
        return done + self._event("response.content_part.done", **where, part=dict(part))

    def _close_open(self) -> bytes:
        if self.open is None:
            return b""
        index, self.open = self.open, None
        item = self.output[index]
        out = self._close_part(index)
        item["status"] = "completed"
        return out + self._event("response.output_item.done", output_index=index, item=dict(item))

    def _call(self, call: Any) -> bytes:
        if not isinstance(call, dict):
            return b""
        position = call.get("index", 0)
        function = call.get("function") or call.get("custom") or {}
        arguments = function.get("arguments", function.get("input")) or ""
        out = b""
        index = self.calls.get(position)
        if index is None:
            out += self._close_open()
            index = self.calls[position] = len(self.output)
            if "custom" not in call and function.get("name") in self.custom:  # a custom tool's, as a function's
                self.inputs[index] = InputStream()
                call = {"id": call.get("id"), "type": "custom"}
            item = call_item(
                {**call, "function": {**function, "arguments": ""}, "custom": {**function, "input": ""}},
                status="in_progress",
                spaces=self.spaces,
            )
            self.output.append(item)
            out += self._event("response.output_item.added", output_index=index, item=dict(item))
        item = self.output[index]
        decoder = self.inputs.get(index)
        if decoder is not None:
            arguments = decoder.feed(arguments)  # the `input` argument's characters, as they come
        if not arguments:
            return out
        field, event = (
            ("input", "response.custom_tool_call_input.delta")
            if item["type"] == "custom_tool_call"
            else ("arguments", "response.function_call_arguments.delta")
        )
        item[field] += arguments
        return out + self._event(event, item_id=item["id"], output_index=index, delta=arguments)

    def end(self) -> bytes:
        """Closes what is open and ends the stream with the whole response (`response.completed`, or
        `response.incomplete` for a `length` or `content_filter` finish)."""
        if self.ended:
            return b""
        out = b"" if self.response is not None else self._start({})
        out += self._close_open()
        for index in self.calls.values():
            item = self.output[index]
            if item["status"] != "completed":
                item["status"] = "completed"
                rest = self.inputs[index].end() if index in self.inputs else ""
                if rest:
                    item["input"] += rest
                    out += self._event(
                        "response.custom_tool_call_input.delta", item_id=item["id"], output_index=index, delta=rest
                    )
                field, event = (
                    ("input", "response.custom_tool_call_input.done")
                    if item["type"] == "custom_tool_call"
                    else ("arguments", "response.function_call_arguments.done")
                )
                out += self._event(event, item_id=item["id"], output_index=index, **{field: item[field]})
                out += self._event("response.output_item.done", output_index=index, item=dict(item))
        self.ended = True
        status, incomplete = status_of(self.finish)
        response = {
            **(self.response or {}),
            "status": status,
            "incomplete_details": incomplete,
            "output": self.output,
            "usage": response_usage(self.usage),
        }
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, response=response)

    def error(self, message: str) -> bytes:
        """Ends a started stream with the Responses `error` event."""
        self.ended = True
        return self._event("error", code="upstream_error", message=message, param=None)


def _part(kind: str, text: str) -> Body:
    if kind == "output_text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "reasoning_text", "text": text}


class ChatFromResponses(EventTranslator):
    """A Responses upstream's events as the chat chunks its client expects (usage last when it asked for it)."""

    def __init__(self, include_usage: bool = False) -> None:
        super().__init__()
        self.include_usage = include_usage
        self.head: Body = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": "",
        }
        self.calls: dict[int, int] = {}  # output index -> tool-call index
        self.started = False
        self.ended = False

    def _chunk(self, delta: Body | None, finish: str | None = None, usage: Body | None = None) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        chunk = {**self.head, "choices": choices}
        if usage is not None:
            chunk["usage"] = usage
        return sse(chunk)

    def event(self, raw: SseEvent) -> bytes:
        """The chat chunks one Responses event makes."""
        event = raw.json()
        if self.ended or not isinstance(event, dict):
            return b""
        kind = event.get("type")
        out = b""
        if isinstance(event.get("response"), dict):
            response = event["response"]
            self.head["id"] = response.get("id") or self.head["id"]
            self.head["created"] = int(response.get("created_at") or self.head["created"])
            self.head["model"] = response.get("model") or self.head["model"]
        if not self.started and kind not in ("error", "response.failed"):
            self.started = True
            out += self._chunk({"role": "assistant", "content": ""})
        if kind == "response.output_text.delta":
            logprobs = event.get("logprobs")
            chunk = self._chunk({"content": event.get("delta") or ""})
            if logprobs:
                body = {
                    **self.head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": event.get("delta") or ""},
                            "finish_reason": None,
                            "logprobs": {"content": logprobs},
                        }
                    ],
                }
                chunk = sse(body)
            return out + chunk
        if kind == "response.refusal.delta":
            return out + self._chunk({"refusal": event.get("delta") or ""})
        if kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            return out + self._chunk({"reasoning_content": event.get("delta") or ""})
        if kind == "response.output_item.added":
            return out + self._added(event)
        if kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            position = self.calls.get(int(event.get("output_index", -1)))
            if position is None:
                return out
            field = "function" if kind.startswith("response.function") else "custom"
            key = "arguments" if field == "function" else "input"
            return out + self._chunk({"tool_calls": [{"index": position, field: {key: event.get("delta") or ""}}]})
        if kind in ("response.completed", "response.incomplete"):
            return out + self._end(event["response"])
        if kind in ("error", "response.failed"):
            error = event.get("response", {}).get("error") if kind == "response.failed" else event
            return out + self.error(str((error or {}).get("message") or "upstream error"))
        return out

    def _added(self, event: Body) -> bytes:
        item = event.get("item") or {}
        if item.get("type") not in ("function_call", "custom_tool_call"):
            if item.get("type") not in ("message", "reasoning"):
                self.lose(dropped(item.get("type")))
            return b""
        position = self.calls[int(event.get("output_index", len(self.calls)))] = len(self.calls)
        if item["type"] == "function_call":
            call = {
                "index": position,
                "id": item.get("call_id"),
                "type": "function",
                "function": {
                    "name": flat_name(item.get("namespace"), item.get("name")),
                    "arguments": item.get("arguments") or "",
                },
            }
        else:
            call = {
                "index": position,
                "id": item.get("call_id"),
                "type": "custom",
                "custom": {
                    "name": flat_name(item.get("namespace"), item.get("name")),
                    "input": item.get("input") or "",
                },
            }
        return self._chunk({"tool_calls": [call]})

    def _end(self, response: Body) -> bytes:
        self.ended = True
        out = self._chunk({}, finish_of(response, bool(self.calls)))
        if self.include_usage:
            out += self._chunk(None, usage=chat_usage(response.get("usage")))
        return out + sse("[DONE]")

    def end(self) -> bytes:
        """The upstream ended without `response.completed`: the chat stream ends as cut short (`length`)."""
        if self.ended:
            return b""
        self.ended = True
        return self._chunk({}, "length") + sse("[DONE]")

    def error(self, message: str) -> bytes:
        """Ends a started stream with OpenAI's mid-stream error."""
        self.ended = True
        error = {"message": message, "type": "upstream_error", "param": None, "code": "upstream_error"}
        return sse({"error": error})
