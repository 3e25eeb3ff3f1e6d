"""The decided endpoints, and reading a decided request's body the same way in the proxy and the middleware.

api = API_BY_PATH.get(scope["path"])                  # None: not a decided endpoint
raw, body = await read_request(scope, receive, limit)  # BadRequest (400/413/415) in words the client can use
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope

from policies import API_TITLES, Config, Policy
from router._anthropic import MESSAGES
from router._apis import CHAT, COMPLETIONS, RESPONSES, Api
from router._http import BodyTooLarge, read_body
from router._state import BadRequest

APIS: tuple[Api, ...] = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)
API_BY_PATH: dict[str, Api] = {api.path: api for api in APIS}
API_BY_NAME: dict[str, Api] = {api.name: api for api in APIS}


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


def policy_for(config: Config, api: Api, model: Any) -> Policy | None:
    """The policy that decides a request of `api` naming `model`: the policy of that name, else
    `server.default_policy`; None when neither (not ours to decide). `BadRequest` (404) when that policy does not
    serve `api` (its `apis`). The proxy, the middleware and explain pick alike."""
    policy = config.policies.get(model) if isinstance(model, str) else None
    if policy is None and config.server.default_policy is not None:
        policy = config.policies[config.server.default_policy]
    if policy is not None and api.name not in policy.apis:
        message = f"the policy {policy.name!r} does not serve the {API_TITLES[api.name]} API (its `apis`)"
        raise BadRequest(message, "model", status=404, code="model_not_found")
    return policy


class DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice is read last-wins here and may be read first-wins by the upstream or the app: the policy
    # would have judged another request than the one served. Refused (issue 16); costs ~0.2 us per JSON object.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise DuplicateKey(key)
    return obj


async def read_request(scope: Scope, receive: Receive, limit: int) -> tuple[bytes, dict[str, Any]]:
    """The body of a decided request, as bytes and as a JSON object; `BadRequest` with the status to answer
    (413 over `limit`, 415 for another content type, 400 for anything but one JSON object with unique keys).
    `ClientDisconnected` passes through."""
    try:
        raw = await read_body(receive, limit)
    except BodyTooLarge as exc:
        raise BadRequest(str(exc), status=413) from None
    content_type = "application/json"
    for key, value in scope["headers"]:
        if key == b"content-type":
            content_type = value.decode("latin-1").split(";")[0].strip().lower()
            break
    if content_type != "application/json":
        raise BadRequest(f"expected content-type application/json, found {content_type!r}", status=415)
    return raw, parse_json(raw)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, object_pairs_hook=_unique)
    except DuplicateKey as exc:
        raise BadRequest(f"the request body gives the key {exc.args[0]!r} twice; send each key once") from None
    except (ValueError, RecursionError) as exc:
        reason = "invalid UTF-8" if isinstance(exc, UnicodeDecodeError) else "invalid JSON"
        raise BadRequest(f"the request body is not a JSON object: {reason}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
