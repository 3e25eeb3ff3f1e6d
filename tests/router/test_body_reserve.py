"""`read_request` reserves a body's declared length at once against the process's bound on bodies held
(router/_asgi/admission.py): a burst of large bodies is admitted whole or refused at once; a body of unknown size
(chunked) is reserved as it arrives."""

from __future__ import annotations

from typing import Any

import pytest

from router._apis.body import read_request
from router._asgi.admission import Admission

pytestmark = pytest.mark.anyio

BODY = b'{"model": "auto", "messages": []}'


async def held_at_first_read(headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """What the request's ticket held when its body's first chunk was asked for, and after the whole body."""
    ticket = Admission(10, 100_000).enter()
    assert ticket is not None
    seen: list[int] = []
    chunks = [BODY[:10], BODY[10:]]

    async def receive() -> dict[str, Any]:
        seen.append(ticket.held)
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    with ticket:
        raw, body = await read_request({"headers": headers}, receive, 4096)
        assert (raw, body["model"]) == (BODY, "auto")
        return seen[0], ticket.held


async def test_a_declared_length_is_reserved_before_the_body_is_read() -> None:
    declared = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    assert await held_at_first_read(declared) == (len(BODY), len(BODY))


async def test_a_body_of_unknown_size_is_reserved_as_it_arrives() -> None:
    assert await held_at_first_read([(b"content-type", b"application/json")]) == (0, len(BODY))
