"""Stored responses and conversations through the pass-through (issue 25.3): `GET`/`DELETE /v1/responses/{id}`,
`.../input_items`, `POST .../cancel`, and `/v1/conversations/{id}` with its items, reach the upstream (called with the
router's own key) only for the caller the router relayed the object to, at the upstream that keeps it; `POST
/v1/conversations` notes the conversation made for the caller it goes to (router/_sessions/owners.py).

    target = await owned(sessions, config, "GET", b"/v1/responses/resp_1", caller.id)   # None: not such a path
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from policies import Config, UpstreamSettings
from router._errors import NoRoute
from router._faces.forward import decided_path
from router._sessions.owners import CONVERSATIONS, answer_id, stored_object
from router._sessions.session import Sessions


class Owned(NamedTuple):
    """Where an object's request goes, and what notes the answer (a conversation made) for its caller."""

    name: str
    upstream: UpstreamSettings
    remember: Callable[[bytes], Awaitable[None]] | None = None


async def owned(sessions: Sessions, config: Config, method: str, raw_path: bytes, caller: str) -> Owned | None:
    """The target of a request naming a stored object, or None for any other path (an ordinary pass-through). An
    object of another caller, or one the router never relayed (unless the upstream is sent the caller's own
    credential), is `BadRequest` 404; a conversation's path spelled otherwise is `NoRoute`."""
    name, upstream = next(iter(config.upstreams.items()))
    path = raw_path.decode("latin-1")
    found = stored_object(path)
    if found is None:
        if path == CONVERSATIONS and method == "POST":  # a conversation made: the caller's from its answer on
            ttl_s = max((policy.session.ttl_s for policy in config.policies.values()), default=3600.0)
            return Owned(name, upstream, functools.partial(_made, sessions, caller, name, ttl_s))
        if decided_path(raw_path, (CONVERSATIONS,)) is not None:  # listed, or spelled so a check could miss it
            raise NoRoute(f"no route for {method} {path}; d3-router forwards conversations by their id only")
        return None
    kind, object_id = found
    record = await sessions.owners.check(kind, object_id, caller, unknown_ok=upstream.forward_client_key)
    if record is not None and record.upstream in config.upstreams:  # the upstream that keeps it
        name, upstream = record.upstream, config.upstreams[record.upstream]
    return Owned(name, upstream)


async def _made(sessions: Sessions, caller: str, upstream: str, ttl_s: float, answer: bytes) -> None:
    conversation = answer_id(answer)
    if conversation is not None:
        await sessions.owners.note("conversation", conversation, caller, upstream=upstream, ttl_s=ttl_s)
