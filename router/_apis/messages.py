"""The Anthropic Messages API adapter (`POST /v1/messages`): Claude Code and the `anthropic` SDK speak it.

Its body: `system` (a string or text blocks) and `messages` whose content is a string or blocks (`text`, `image`
from base64 or a URL, `tool_use`, `tool_result`, `thinking`). Its errors:
`{"type": "error", "error": {"type": "permission_error", "message": ...}}`, the type following the status as
Anthropic's API does, so the SDK raises its own typed exception. Its key goes in `x-api-key`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from router._apis.chat import Api
from router._apis.content import Content, json_text, kind_of, need_list, need_object, need_str
from router._apis.state import Turn
from router._asgi.headers import Headers
from router._errors import BadRequest

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}  # fmt: skip


class Messages(Api):
    name = "messages"
    path = "/v1/messages"
    upstream_path = "/messages"
    key_header = b"x-api-key"
    answer_model = (("model",), ("message", "model"))  # the answer; the stream's `message_start`
    count_path = "/v1/messages/count_tokens"

    def turns(self, body: Mapping[str, Any], content: Content) -> list[Turn]:
        turns = []
        system = body.get("system")
        if system is not None:
            for index, block in enumerate(system if isinstance(system, list) else ()):
                kind = block.get("type") if isinstance(block, dict) else None
                if isinstance(kind, str) and kind != "text":  # an image here would never be vetted nor judged
                    raise BadRequest(f"system[{index}] has type {kind!r}; `system` takes text blocks only",
                                     f"system[{index}].type")  # fmt: skip
            turns.append(Turn("system", self.blocks(system, "system", content, role="system")[0].text))
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("`messages` is missing; expected a list of messages", "messages")
        need_list(messages, "messages", "a list of messages")
        if not messages:
            raise BadRequest("`messages` is empty; expected at least one message", "messages")
        for index, message in enumerate(messages):
            where = f"messages[{index}]"
            need_object(message, where, "an object with `role` and `content`")
            role = message.get("role")
            if role not in ("user", "assistant", "system"):
                raise BadRequest(f"{where}.role must be one of assistant, system, user", f"{where}.role")
            # Claude Code (2.1) sends system messages inside `messages` (the agent types it offers, between turns):
            # read as system turns, and judged as every turn is (issue 26).
            turns.extend(self.blocks(message.get("content"), f"{where}.content", content, role))
        return turns

    def blocks(self, value: Any, where: str, content: Content, role: str) -> list[Turn]:
        """Content blocks as turns: tool results become turns of their own (role `tool`), before the message's own
        text; `tool_use` blocks are the turn's tool calls."""
        if isinstance(value, str):
            return [Turn(role, value)]
        if not isinstance(value, list):
            raise BadRequest(f"{where} must be a string or a list of content blocks, found {kind_of(value)}", where)
        texts: list[str] = []
        media: list[tuple[str, str]] = []
        calls: list[str] = []
        results: list[Turn] = []
        for index, block in enumerate(value):
            at = f"{where}[{index}]"
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise BadRequest(f"{at} must be an object with a `type`", at)
            kind = block["type"]
            if kind == "text":
                texts.append(need_str(block.get("text"), f"{at}.text"))
            elif kind == "thinking":
                texts.append(need_str(block.get("thinking"), f"{at}.thinking"))
            elif kind == "redacted_thinking":
                pass  # the model's own encrypted reasoning: nothing a client wrote
            elif kind == "image":
                url = _image(block.get("source"), f"{at}.source", content)
                if url:
                    media.append(("image", url))
            elif kind == "tool_use":
                name = need_str(block.get("name"), f"{at}.name")
                calls.append(f"[tool call] {name}({json_text(block.get('input'), f'{at}.input')})")
            elif kind == "tool_result" and role == "user":
                inner = block.get("content")
                pieces = self.blocks("" if inner is None else inner, f"{at}.content", content, "tool")
                results.extend(pieces)
            else:  # documents, server tools' results, and types this router does not know
                content.unreadable(kind, at)
        if texts or media or calls or not results:
            return [*results, Turn(role, "\n".join(texts), tuple(media), tuple(calls))]
        return results

    def error(self, status: int, message: str, type_: str, code: str | int | None = None, param: str | None = None
              ) -> bytes:  # fmt: skip
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    def stream_error(self, message: str) -> bytes:
        """Anthropic's `event: error` (the SDK raises it as an APIStatusError)."""
        return b"event: error\ndata: " + self.error(502, message, "api_error") + b"\n\n"

    def key_headers(self, key: str) -> Headers:
        return [(b"x-api-key", key.encode("latin-1", "replace"))]

    def model_list(self, names: list[str], created: int) -> bytes:
        """`GET /v1/models` in Anthropic's list shape (a request carrying `anthropic-version`)."""
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
        data = [{"type": "model", "id": name, "display_name": name, "created_at": at} for name in names]
        return json.dumps({"data": data, "has_more": False, "first_id": names[0] if names else None,
                           "last_id": names[-1] if names else None}).encode()  # fmt: skip


def _image(source: Any, where: str, content: Content) -> str:
    """An image block's source as a URL the media rules vet: a data URL for base64, the URL itself for `url`."""
    source = need_object(source, where, "an object with a `type` (base64 or url)")
    kind = source.get("type")
    if not isinstance(kind, str):
        raise BadRequest(f"{where}.type must be base64 or url, found {kind_of(kind)}", f"{where}.type")
    if kind == "base64":
        media_type = need_str(source.get("media_type"), f"{where}.media_type")
        data = need_str(source.get("data"), f"{where}.data")
        return f"data:{media_type};base64,{data}"
    if kind == "url":
        return need_str(source.get("url"), f"{where}.url")
    content.unreadable(kind, where)  # e.g. a file id: nothing the engine can be handed
    return ""


MESSAGES = Messages()
