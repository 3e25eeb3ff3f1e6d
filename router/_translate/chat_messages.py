"""Chat Completions clients carried by an Anthropic Messages upstream.

    tr = translation("chat", "messages")
    messages_body, lost = tr.request(chat_body)   # system messages -> `system`, tool messages -> tool_result blocks
    completion, lost = tr.answer(message)         # content blocks -> message, stop_reason -> finish_reason

Messages requires `max_tokens`: a request without one gets `DEFAULT_MAX_TOKENS`. `reasoning_effort` is Messages'
`output_config.effort`, `response_format`'s JSON schema its `output_config.format`. What Messages cannot hold is named
(docs/translation.md): temperature, top_p, n, penalties, logprobs, seed, cache_control past the four blocks Anthropic
allows; of the answer, thinking signatures (a chat client cannot send them back).
"""

from __future__ import annotations

import json
import time
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

DEFAULT_MAX_TOKENS = 4096
MAX_CACHE_BLOCKS = 4  # Anthropic refuses a request with more cache_control blocks
EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})  # Messages' output_config.effort, as chat's
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "refusal": "content_filter", "pause_turn": "stop",
                  "model_context_window_exceeded": "length"}  # fmt: skip
# Messages (its current SDK's types) takes no sampling parameters: the model samples as it was tuned to.
_UNCARRIED = ("temperature", "top_p", "n", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
              "top_logprobs", "seed", "modalities", "audio", "prediction", "web_search_options", "store",
              "service_tier")  # fmt: skip


@pair("chat", "messages")
class ChatOverMessages:
    client: ApiName = "chat"
    upstream: ApiName = "messages"
    upstream_path = MESSAGES.upstream_path

    def __init__(self) -> None:
        self.usage_chunk = False  # the client asked for the usage chunk (stream_options.include_usage)

    # --- the request ----------------------------------------------------------------------------------------------
    def request(self, body: Body) -> tuple[Body, list[str]]:
        lost: list[str] = []
        cache = [0]
        system: list[Body] = []
        messages: list[Body] = []
        for message in items(body.get("messages")):
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if message.get("name") is not None:
                named(lost, "message_name_dropped")
            if role in ("system", "developer"):
                if messages:
                    named(lost, "system_moved_to_top")
                system.extend(_blocks(message.get("content"), lost, cache, images=False))
            elif role == "tool":
                result = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                          "content": _blocks(message.get("content"), lost, cache, images=False)}  # fmt: skip
                _append(messages, "user", [result])
            elif role == "assistant":
                _append(messages, "assistant", _assistant(message, lost, cache))
            elif role == "user":
                _append(messages, "user", _blocks(message.get("content"), lost, cache, images=True))
            else:  # `function`, the legacy tool result, has no id to answer
                named(lost, dropped(role, "message_dropped"))
        out: Body = {"model": body.get("model"), "messages": messages}
        if system:
            out["system"] = system
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        out["max_tokens"] = limit if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_TOKENS
        stop = body.get("stop")
        if isinstance(stop, str):
            out["stop_sequences"] = [stop]
        elif isinstance(stop, list) and stop:
            out["stop_sequences"] = [item for item in stop if isinstance(item, str)]
        if body.get("stream"):
            out["stream"] = True
            options = body.get("stream_options")
            self.usage_chunk = isinstance(options, dict) and bool(options.get("include_usage"))
        tools = [_tool(tool, lost) for tool in items(body.get("tools")) if isinstance(tool, dict)]
        if tools:
            out["tools"] = tools
        _tool_choice(body, out)
        self._effort(body, out, lost)
        if isinstance(body.get("user"), str):
            out["metadata"] = {"user_id": body["user"]}
        if body.get("metadata"):
            named(lost, "metadata_dropped")
        response_format = body.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
            schema = obj(response_format.get("json_schema"))
            out.setdefault("output_config", {})["format"] = {
                "type": "json_schema",
                "schema": obj(schema.get("schema")),
            }
        elif isinstance(response_format, dict) and response_format.get("type") == "json_object":
            named(lost, "response_format_dropped")
        for name in _UNCARRIED:
            if body.get(name) is not None and not (name == "n" and body[name] == 1):
                named(lost, f"{name}_dropped")
        if cache[0] > MAX_CACHE_BLOCKS:
            named(lost, "cache_control_over_limit")
        return out, lost

    def _effort(self, body: Body, out: Body, lost: list[str]) -> None:
        """`reasoning_effort` as Messages' `output_config.effort` (`minimal` is low; `none` turns thinking off)."""
        effort = body.get("reasoning_effort")
        if effort == "none":
            out["thinking"] = {"type": "disabled"}
        elif effort == "minimal":
            named(lost, "reasoning_effort_approximated")
            out.setdefault("output_config", {})["effort"] = "low"
        elif isinstance(effort, str) and effort in EFFORTS:
            out.setdefault("output_config", {})["effort"] = effort

    # --- the answer -----------------------------------------------------------------------------------------------
    def answer(self, body: Body) -> tuple[Body, list[str]]:
        lost: list[str] = []
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[Body] = []
        for block in items(body.get("content")):
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text", ""))
            elif kind == "thinking":
                thinking.append(block.get("thinking", ""))
                if block.get("signature") not in (None, "", UNSIGNED):  # a model's own signature
                    named(lost, "thinking_signature_dropped")
            elif kind == "tool_use":
                calls.append(_call(block, len(calls)))
            else:
                named(lost, dropped(kind))  # redacted thinking, server tools' blocks
        message: Body = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
        if thinking:
            message["reasoning_content"] = "\n".join(thinking)
        if calls:
            message["tool_calls"] = [{key: value for key, value in call.items() if key != "index"} for call in calls]
        reason = body.get("stop_reason")
        finish = FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop"
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        answer = {"id": _chat_id(body.get("id")), "object": "chat.completion", "created": int(time.time()),
                  "model": body.get("model", ""), "choices": [choice], "usage": usage(body.get("usage"))}  # fmt: skip
        return answer, lost

    def stream(self) -> MessagesToChatStream:
        return MessagesToChatStream(self.usage_chunk)

    def error(self, status: int, body: bytes) -> bytes:
        message, kind = error_message(body)
        return CHAT.error(status, message, kind or "upstream_error")


def usage(value: Any) -> Body:
    """Messages' usage as chat's: the cache's reads and writes are part of the prompt."""
    value = value if isinstance(value, dict) else {}
    read, written = value.get("cache_read_input_tokens") or 0, value.get("cache_creation_input_tokens") or 0
    prompt = (value.get("input_tokens") or 0) + read + written
    completion = value.get("output_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}}  # fmt: skip


def _index(event: Body) -> int:
    """A Messages event's block index (0 if it has none fit to be one)."""
    index = event.get("index")
    return index if isinstance(index, int) else 0


def _chat_id(message_id: Any) -> str:
    return f"chatcmpl-{message_id}" if isinstance(message_id, str) and message_id else f"chatcmpl-{uuid.uuid4().hex}"


def _call(block: Body, index: int) -> Body:
    arguments = json.dumps(obj(block.get("input")), ensure_ascii=False)
    return {"index": index, "id": block.get("id"), "type": "function",
            "function": {"name": block.get("name", ""), "arguments": arguments}}  # fmt: skip


def _append(messages: list[Body], role: str, blocks: list[Body]) -> None:
    """A message, merged into the last when it has the same role (tool results and the user's turn after them)."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _cache(part: Body, block: Body, cache: list[int]) -> None:
    """Carry a part's cache_control (an extension some chat clients send) up to the four blocks Anthropic allows."""
    if part.get("cache_control") is not None:
        cache[0] += 1
        if cache[0] <= MAX_CACHE_BLOCKS:
            block["cache_control"] = part["cache_control"]


def _blocks(content: Any, lost: list[str], cache: list[int], *, images: bool) -> list[Body]:
    """Chat content (a string or parts) as Messages blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[Body] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        block: Body | None = None
        if kind == "text" and isinstance(part.get("text"), str):
            block = {"type": "text", "text": part["text"]}
        elif kind == "image_url" and images:
            block = _image(part.get("image_url"), lost)
        else:
            named(lost, dropped(kind, "part_dropped"))  # audio, files; images where Messages takes text only
        if block is not None:
            _cache(part, block, cache)
            blocks.append(block)
    return blocks


def _image(holder: Any, lost: list[str]) -> Body | None:
    url = holder.get("url") if isinstance(holder, dict) else holder
    if not isinstance(url, str):
        named(lost, "image_url_part_dropped")
        return None
    if isinstance(holder, dict) and holder.get("detail") not in (None, "auto"):
        named(lost, "image_detail_dropped")
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url.removeprefix("data:").partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _assistant(message: Body, lost: list[str], cache: list[int]) -> list[Body]:
    blocks = _blocks(message.get("content"), lost, cache, images=False)
    if message.get("reasoning_content") or message.get("reasoning"):
        named(lost, "reasoning_dropped")  # Anthropic takes thinking back only with the signature its model made
    if isinstance(message.get("refusal"), str):
        blocks.append({"type": "text", "text": message["refusal"]})
    for call in items(message.get("tool_calls")):
        if not isinstance(call, dict):
            continue
        function = obj(call.get("function"))
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            named(lost, "tool_arguments_unparsable")
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                       "name": function.get("name", ""),
                       "input": arguments if isinstance(arguments, dict) else {"value": arguments}})  # fmt: skip
    if not blocks:
        blocks.append({"type": "text", "text": ""})
        named(lost, "empty_assistant_message")
    return blocks


def _tool(tool: Body, lost: list[str]) -> Body:
    function = obj(tool.get("function"))
    out: Body = {"name": function.get("name", ""), "input_schema": function.get("parameters") or {"type": "object"}}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    if function.get("strict"):
        named(lost, "tool_strict_dropped")
    return out


def _tool_choice(body: Body, out: Body) -> None:
    choice = body.get("tool_choice")
    made: Body | None = None
    if choice == "auto":
        made = {"type": "auto"}
    elif choice == "required":
        made = {"type": "any"}
    elif choice == "none":
        made = {"type": "none"}
    elif isinstance(choice, dict):
        made = {"type": "tool", "name": obj(choice.get("function")).get("name", "")}
    if body.get("parallel_tool_calls") is False and "tools" in out:
        made = {**(made or {"type": "auto"}), "disable_parallel_tool_use": True}
    if made is not None and "tools" in out:
        out["tool_choice"] = made


class MessagesToChatStream(EventTranslator):
    """Messages events as chat chunks: the role at message_start, text_delta as content, thinking_delta as
    reasoning_content, each tool_use block a tool call (input_json_delta as its arguments), message_delta's stop
    reason as finish_reason, the usage chunk when asked for, then `[DONE]`."""

    def __init__(self, usage_chunk: bool) -> None:
        super().__init__()
        self.usage_chunk = usage_chunk
        self.id, self.model, self.created = _chat_id(None), "", int(time.time())
        self.usage: Body = {}
        self.tools: dict[int, int] = {}  # a tool_use block's index -> its tool call's index
        self.done = False

    def chunk(self, delta: Body, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [choice]})  # fmt: skip

    def event(self, event: SseEvent) -> bytes:
        data = event.json()
        if not isinstance(data, dict):
            return b""
        kind = data.get("type") or event.event
        if kind == "message_start":
            message = obj(data.get("message"))
            self.id, self.model = _chat_id(message.get("id")), message.get("model", "")
            self.usage = dict(obj(message.get("usage")))
            return self.chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            block = obj(data.get("content_block"))
            if block.get("type") == "tool_use":
                index = self.tools[_index(data)] = len(self.tools)
                call = {"index": index, "id": block.get("id"), "type": "function",
                        "function": {"name": block.get("name", ""), "arguments": ""}}  # fmt: skip
                return self.chunk({"tool_calls": [call]})
            if block.get("type") not in ("text", "thinking"):
                self.lose(dropped(block.get("type")))
            return b""
        if kind == "content_block_delta":
            return self.delta(data)
        if kind == "message_delta":
            self.usage.update({k: v for k, v in obj(data.get("usage")).items() if v is not None})
            reason = obj(data.get("delta")).get("stop_reason")
            return self.chunk({}, FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop")
        if kind == "message_stop":
            return self.end()
        if kind == "error":
            text, _ = error_message(event.data.encode())
            return self.error(text)
        return b""  # ping, content_block_stop

    def delta(self, data: Body) -> bytes:
        delta = obj(data.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            return self.chunk({"content": delta.get("text", "")})
        if kind == "thinking_delta":
            return self.chunk({"reasoning_content": delta.get("thinking", "")})
        if kind == "input_json_delta":
            index = self.tools.get(_index(data), 0)
            return self.chunk({"tool_calls": [{"index": index, "function": {"arguments": delta.get("partial_json")}}]})
        if kind == "signature_delta" and delta.get("signature") != UNSIGNED:
            self.lose("thinking_signature_dropped")
        return b""

    def end(self) -> bytes:
        if self.done:
            return b""
        self.done = True
        out = b""
        if self.usage_chunk:
            out = sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model, "choices": [], "usage": usage(self.usage)})  # fmt: skip
        return out + b"data: [DONE]\n\n"

    def error(self, message: str) -> bytes:
        self.done = True
        return CHAT.stream_error(message)
