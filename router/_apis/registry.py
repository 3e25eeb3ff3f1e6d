"""The decided endpoints: the adapters by path and by name, and telling a body's API for dry runs.

api = API_BY_PATH.get(scope["path"])                  # None: not a decided endpoint
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from router._apis.chat import CHAT, Api
from router._apis.completions import COMPLETIONS
from router._apis.messages import MESSAGES
from router._apis.responses import RESPONSES
from router._asgi.headers import header
from router._errors import BadRequest

APIS: tuple[Api, ...] = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)
API_BY_PATH: dict[str, Api] = {api.path: api for api in APIS}
API_BY_NAME: dict[str, Api] = {api.name: api for api in APIS}


def error_api(path: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> Api:
    """The API whose shape a path's errors (and `GET /v1/models`) take: a decided endpoint's own; Anthropic's for
    every `/v1/messages*` path and for `/v1/models` asked with `anthropic-version` (issue 26.3); else OpenAI's."""
    api = API_BY_PATH.get(path)
    if api is not None:
        return api
    if path.startswith("/v1/messages") or (path == "/v1/models" and header(headers, b"anthropic-version")):
        return MESSAGES
    return CHAT


def detect(body: dict[str, Any], name: str | None = None) -> Api:
    """The API a body is written for (explain's dry runs): `name` when given, else by its fields: `input` is the
    Responses API, `prompt` Completions, a top-level `system` Anthropic Messages, anything else chat."""
    if name is not None:
        api = API_BY_NAME.get(name)
        if api is None:
            raise BadRequest(f"unknown api {name!r}; expected one of {', '.join(API_BY_NAME)}", "api")
        return api
    if "input" in body:
        return RESPONSES
    if "prompt" in body:
        return COMPLETIONS
    if "system" in body:
        return MESSAGES
    return CHAT
