"""Whose each object kept at an upstream is (issue 25.3): a Responses response or a conversation lives at the upstream,
which the router calls with its own key, so any caller naming its id would read, continue or delete it there.

    owners = Owners(store, sessions.hash)
    await owners.note("response", "resp_1", caller, upstream="large", ttl_s=3600, session=key)  # relayed to caller
    record = await owners.check("response", "resp_1", caller)    # its record; another's or unknown: 404

The router notes, per object id it relays (a Responses answer's `id`, a `POST /v1/conversations` answer's `id`), a
hash of the caller it went to, the session it belongs to and the upstream that keeps it. A request of another caller
naming it is refused with OpenAI's own answer to an id it does not know (404 invalid_request_error, the SDKs'
`NotFoundError`), the same words for an id of another caller and for one never relayed, so that a caller learns
nothing of others' ids. An id the router never relayed is refused too, unless the upstream is sent the caller's own
credential (`upstreams.NAME.forward_client_key`: it authenticates the caller itself). Records are hashed (salted
BLAKE2) and kept as long as the policy's session (`ttl_s`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from router._errors import BadRequest
from router._sessions.store import Store

# The stored-object paths of the Responses and Conversations APIs: an object, its items, a response's input items
# or its cancel. Plain characters only: any other spelling of a path is the pass-through's own business.
_PATH = re.compile(
    r"/v1/(responses|conversations)/([A-Za-z0-9_-]+)(?:/(?:input_items|cancel|items(?:/[A-Za-z0-9_-]+)?))?"
)
_KINDS = {"responses": "response", "conversations": "conversation"}
_RESERVED = frozenset({"input_tokens"})  # /v1/responses/input_tokens: the router's own route (token counting)
CONVERSATIONS = "/v1/conversations"  # POST: a conversation made, noted for the caller it went to


class Record(NamedTuple):
    caller: str  # hashed
    session: str  # the hashed session key, or empty
    upstream: str  # the upstream that keeps it, or empty (a record of an older release)


def stored_object(path: str) -> tuple[str, str] | None:
    """The kind (`response`, `conversation`) and id of the object a pass-through path names, or None."""
    match = _PATH.fullmatch(path)
    if match is None or match[2] in _RESERVED:
        return None
    return _KINDS[match[1]], match[2]


def conversation_of(body: Mapping[str, Any]) -> str | None:
    """The conversation a Responses request continues: `conversation` as its id or as `{"id": ...}`."""
    value = body.get("conversation")
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


def answer_id(answer: bytes) -> str | None:
    """The `id` of a JSON answer, or of the response an event carries (`response.created`); None if unreadable."""
    try:
        data = json.loads(answer)
    except ValueError:  # not JSON (an error page)
        return None
    if isinstance(data, dict) and isinstance(data.get("response"), dict):
        data = data["response"]
    value = data.get("id") if isinstance(data, dict) else None
    return value if isinstance(value, str) and value else None


class Owners:
    """The records of relayed objects, in the sessions' store."""

    def __init__(self, store: Store, hash_: Callable[..., str]) -> None:
        self.store = store
        self.hash = hash_

    async def note(self, kind: str, object_id: str, caller: str, *, upstream: str, ttl_s: float, session: str = ""
                   ) -> None:  # fmt: skip
        value = f"{self.hash('caller', caller)} {session} {upstream}"
        await self.store.set(self._key(kind, object_id), value, ttl_s)

    async def record(self, kind: str, object_id: str) -> Record | None:
        stored = await self.store.get(self._key(kind, object_id))
        if stored is None:
            return None
        owner, _, rest = stored.partition(" ")
        session, _, upstream = rest.partition(" ")
        return Record(owner, session, upstream)

    async def check(self, kind: str, object_id: str, caller: str, *, param: str | None = None,
                    unknown_ok: bool = False) -> Record | None:  # fmt: skip
        """The object's record if `caller` may name it; another caller's, or an unknown one unless `unknown_ok`
        (the upstream authenticates the caller itself): `BadRequest` 404 in OpenAI's words."""
        record = await self.record(kind, object_id)
        if record is None and unknown_ok:
            return None
        if record is None or record.caller != self.hash("caller", caller):
            raise BadRequest(f"{kind.capitalize()} with id '{object_id}' not found.", param, status=404)
        return record

    def _key(self, kind: str, object_id: str) -> str:
        return f"d3:{kind}:{self.hash(kind, object_id)}"
