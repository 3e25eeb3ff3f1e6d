"""The Chat Completions adapter, the base every other adapter changes what differs in.

    api = API_BY_PATH["/v1/responses"]
    state = api.state(body, policy.state, media, lenient=False)    # BadRequest if the body cannot be read
    payload = api.rewrite(raw, body, "big-model", {"max_tokens": 64})
    api.error(403, "Refused by policy.", "policy_violation")          # the error body in the API's own shape

An adapter owns the body's shape (its turns, text parts, images, tool calls and results), the model and parameter
rewrite (`policies.param_path`), the upstream path, the key header and the error body. The proxy, the decision,
fallbacks, metrics and logs never ask which API they serve.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from d3backend import json_bytes
from policies import ApiName, StateSettings, param_path
from router._apis.content import Content, json_text, kind_of, need_list, need_str
from router._apis.state import DEFAULT_MEDIA, DecisionState, MediaRules, Turn, build_state
from router._asgi.headers import Headers
from router._asgi.messages import error_payload
from router._errors import BadRequest

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# The part types whose text the decision reads, and the field holding it (OpenAI's chat and Responses parts).
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
              "summary_text": "text", "reasoning_text": "text"}  # fmt: skip


class Api:
    """The Chat Completions API; the other adapters change what differs."""

    name: ClassVar[ApiName] = "chat"
    path: ClassVar[str] = "/v1/chat/completions"
    upstream_path: ClassVar[str] = "/chat/completions"
    key_header: ClassVar[bytes] = b"authorization"
    # Its answers carry an id a later request may continue from (Responses' `previous_response_id`): a session
    # remembers them.
    chains_answers: ClassVar[bool] = False
    # Where its answer names the model (router/_asgi/answer.py): the keys leading to it, in a JSON answer and in a
    # stream event's data; chat's chunks name it at the top, as its answers do.
    answer_model: ClassVar[tuple[tuple[str, ...], ...]] = (("model",),)
    # Its token-counting endpoint (router/_faces/counting.py), if the API has one: the client's path.
    count_path: ClassVar[str | None] = None

    def state(self, body: Mapping[str, Any], settings: StateSettings, media: MediaRules, *, lenient: bool = False
              ) -> DecisionState:  # fmt: skip
        content = Content(lenient=lenient)
        return build_state(self.turns(body, content), settings, media, content.ignored)

    def turns(self, body: Mapping[str, Any], content: Content) -> list[Turn]:
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("`messages` is missing; expected a list of chat messages", "messages")
        if not isinstance(messages, list):
            raise BadRequest(f"`messages` must be a list, found {kind_of(messages)}", "messages")
        if not messages:
            raise BadRequest("`messages` is empty; expected at least one message", "messages")
        turns = []
        for index, message in enumerate(messages):
            where = f"messages[{index}]"
            if not isinstance(message, dict):
                raise BadRequest(f"{where} must be an object with `role` and `content`, found {kind_of(message)}",
                                 where)  # fmt: skip
            role = message.get("role")
            if not isinstance(role, str) or role not in CHAT_ROLES:
                raise BadRequest(f"{where}.role must be one of {', '.join(sorted(CHAT_ROLES))}", f"{where}.role")
            text, media = parts(message.get("content"), f"{where}.content", content)
            calls = tuple(_tool_calls(message, where))
            turns.append(Turn("tool" if role == "function" else role, text, media, calls))
        return turns

    def tools(self, body: Mapping[str, Any]) -> int:
        """How many tools the request offers the model (the `request.tools` fact)."""
        tools = body.get("tools")
        return len(tools) if isinstance(tools, list) else 0

    def error(self, status: int, message: str, type_: str, code: str | int | None = None, param: str | None = None
              ) -> bytes:  # fmt: skip
        return error_payload(message, type_, code, param)

    def stream_error(self, message: str) -> bytes:
        """The event that ends a started stream whose upstream broke off: OpenAI's mid-stream error (a `data:` line
        with an `error` object), which the SDKs raise as an APIError."""
        return b"data: " + self.error(502, message, "upstream_error") + b"\n\n"

    def key_headers(self, key: str) -> Headers:
        return [(b"authorization", f"Bearer {key}".encode("latin-1", "replace"))]

    def counted(self, tokens: int) -> bytes:
        """The token-counting endpoint's answer, for the router's own estimate."""
        return json_bytes({"input_tokens": tokens})

    def model_list(self, names: list[str], created: int) -> bytes:
        """`GET /v1/models` in OpenAI's list shape."""
        data = [{"id": name, "object": "model", "created": created, "owned_by": "d3-router"} for name in names]
        return json_bytes({"object": "list", "data": data})

    def rewrite(self, raw: bytes, body: Mapping[str, Any], model: str | None, params: Mapping[str, Any]) -> bytes:
        """The client's bytes unless the route rewrites the model or a rule sets parameters (named as in chat)."""
        if not params and (model is None or body.get("model") == model):
            return raw
        changed = dict(body)
        for name, value in params.items():
            path = param_path(self.name, name)
            if path is None:  # `d3router check` refuses such a policy; a library user gets the same guarantee
                continue
            if len(path) == 1:
                changed[path[0]] = value
            else:
                holder = changed.get(path[0])
                changed[path[0]] = {**(holder if isinstance(holder, dict) else {}), path[1]: value}
        if model is not None:
            changed["model"] = model
        try:
            return json_bytes(changed)
        except RecursionError:  # parsed just within the recursion limit, a few frames up: a fresh stack has room
            return _on_fresh_stack(changed)


def parts(value: Any, where: str, content: Content) -> tuple[str, tuple[tuple[str, str], ...]]:
    """An OpenAI content value (a string or a list of parts) as its text and its media."""
    if value is None:
        return "", ()
    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a string or a list of content parts, found {kind_of(value)}", where)
    texts: list[str] = []
    media: list[tuple[str, str]] = []
    for index, part in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadRequest(f"{at} must be an object with a `type`", at)
        kind = part["type"]
        field = TEXT_PARTS.get(kind)
        if field is not None:
            texts.append(need_str(part.get(field), f"{at}.{field}"))
        elif kind in ("image_url", "video_url"):
            holder = part.get(kind)
            url = holder.get("url") if isinstance(holder, dict) else holder
            media.append((kind.removesuffix("_url"), url if isinstance(url, str) else ""))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            media.append(("image", part["image_url"]))
        elif kind == "input_image" and part.get("file_id") is not None:
            content.unreadable(kind, at, "is an image by file_id (send its image_url instead)")
        elif kind == "input_image":
            url = part.get("image_url")
            raise BadRequest(f"{at}.image_url must be a string (an https or data URL), found {kind_of(url)}",
                             f"{at}.image_url")  # fmt: skip
        else:  # audio, files, and types this router does not know
            content.unreadable(kind, at)
    return "\n".join(texts), tuple(media)


def _tool_calls(message: Mapping[str, Any], where: str) -> list[str]:
    """An assistant message's tool calls as text lines: `[tool call] name(arguments)`."""
    calls = message.get("tool_calls")
    legacy = message.get("function_call")
    found = []
    # The assistant's own calls, rendered where well-formed: the upstream judges their shape.
    for index, call in enumerate(need_list(calls, f"{where}.tool_calls", "a list") if calls is not None else ()):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            found.append(_call_text(function, f"{where}.tool_calls[{index}].function"))
    if isinstance(legacy, dict):
        found.append(_call_text(legacy, f"{where}.function_call"))
    return found


def _call_text(function: Mapping[str, Any], where: str) -> str:
    arguments = function.get("arguments", "")
    text = arguments if isinstance(arguments, str) else json_text(arguments, f"{where}.arguments")
    return f"[tool call] {function.get('name')}({text})"


CHAT = Api()


def extract_state(
    messages: Any, settings: StateSettings, media: MediaRules = DEFAULT_MEDIA, *, lenient: bool = False
) -> DecisionState:
    """The decision state of chat `messages` (the Chat Completions adapter's reading); `BadRequest` if unreadable."""
    return CHAT.state({"messages": messages}, settings, media, lenient=lenient)


def _on_fresh_stack(body: Mapping[str, Any]) -> bytes:
    """`json_bytes(body)` in a new thread, whose stack starts empty: only for bodies nested near the limit."""
    encoded: list[bytes] = []

    def encode() -> None:
        with contextlib.suppress(RecursionError):  # deeper than a parser could have read: a library caller's
            encoded.append(json_bytes(body))

    thread = threading.Thread(target=encode, name="d3-rewrite")
    thread.start()
    thread.join()
    if not encoded:
        raise BadRequest("the request body is nested too deeply to be forwarded")
    return encoded[0]
