"""Reading a decided request's body the same way in the proxy and the middleware.

raw, body = await read_request(scope, receive, limit)  # BadRequest (400/413/415) in words the client can use
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope

from router._asgi.headers import content_length, header
from router._asgi.messages import read_body
from router._errors import BadRequest, NotJson


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
    raw = await read_body(receive, limit, content_length(scope["headers"]))
    given = header(scope["headers"], b"content-type")
    content_type = "application/json" if given is None else given.decode("latin-1").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise NotJson(f"expected content-type application/json, found {content_type!r}")
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
