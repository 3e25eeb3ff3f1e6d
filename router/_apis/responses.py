"""The Responses API adapter: `instructions`, and `input` as a string or a list of items."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from router._apis.chat import Api, parts
from router._apis.content import Content, need_list, need_object, need_str
from router._apis.state import Turn
from router._errors import BadRequest


class Responses(Api):
    """The Responses API: `instructions`, and `input` as a string or a list of items."""

    name = "responses"
    path = "/v1/responses"
    upstream_path = "/responses"
    chains_answers = True
    answer_model = (("model",), ("response", "model"))  # the answer; `response.created`, `.in_progress`, `.completed`
    count_path = "/v1/responses/input_tokens"

    def counted(self, tokens: int) -> bytes:
        return json.dumps({"object": "response.input_tokens", "input_tokens": tokens}).encode()

    def stream_error(self, message: str) -> bytes:
        """The Responses stream's `error` event (its `sequence_number` is not known here: the SDKs do not check it)."""
        event = {"type": "error", "code": "upstream_error", "message": message, "param": None, "sequence_number": 0}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"

    def turns(self, body: Mapping[str, Any], content: Content) -> list[Turn]:
        turns = []
        instructions = body.get("instructions")
        if instructions is not None:
            turns.append(Turn("system", need_str(instructions, "instructions")))
        items = body.get("input")
        if items is None:
            raise BadRequest("`input` is missing; expected a string or a list of input items", "input")
        if isinstance(items, str):
            return [*turns, Turn("user", items)]
        need_list(items, "input", "a string or a list of input items")
        for index, item in enumerate(items):
            where = f"input[{index}]"
            need_object(item, where, "an input item (an object)")
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise BadRequest(f"{where}.role must be one of assistant, developer, system, user", f"{where}.role")
                text, media = parts(item.get("content"), f"{where}.content", content)
                turns.append(Turn(role, text, media))
            elif kind in ("function_call", "custom_tool_call"):
                name = need_str(item.get("name"), f"{where}.name")
                field = "arguments" if kind == "function_call" else "input"
                arguments = need_str(item.get(field, ""), f"{where}.{field}")
                turns.append(Turn("assistant", "", (), (f"[tool call] {name}({arguments})",)))
            elif kind in ("function_call_output", "custom_tool_call_output"):
                text, media = parts(item.get("output"), f"{where}.output", content)
                turns.append(Turn("tool", text, media))
            elif kind == "reasoning":
                summary = item.get("summary") or []
                text, _ = parts(need_list(summary, f"{where}.summary", "a list"), f"{where}.summary", content)
                turns.append(Turn("assistant", text))
            elif isinstance(kind, str):
                content.unreadable(kind, where)
            else:
                raise BadRequest(f"{where}.type must be a string", f"{where}.type")
        if not turns:
            raise BadRequest("`input` is empty; expected at least one item", "input")
        return turns


RESPONSES = Responses()
