"""Reading a request body with a cap, sending an answer, and cancelling the work of a client that leaves."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

from starlette.types import Message, Receive, Send

from router._asgi.admission import reserve
from router._asgi.headers import Headers
from router._errors import BodyTooLarge, Overloaded

logger = logging.getLogger(__name__)


class ClientDisconnected(Exception):
    """The client went away before its request body was complete: there is no one left to answer."""


async def read_body(receive: Receive, limit: int, expected: int = 0) -> bytes:
    """The whole request body; `BodyTooLarge` as soon as it passes `limit` bytes, `ClientDisconnected` if the
    client leaves first. `expected` (its content-length) is reserved at once against the process's bound on bodies
    held (server.max_buffered_bytes), so that a burst of large bodies is admitted whole or refused at once (503)
    instead of every one of them stalling half-read; a body without one is reserved as it arrives."""
    chunks: list[bytes] = []
    size = 0
    reserved = min(expected, limit + 1)
    try:
        reserve(reserved)
    except Overloaded:
        await drain(receive, limit)
        raise
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > reserved:
            try:
                reserve(size - reserved)
            except Overloaded:
                if message.get("more_body", False):
                    await drain(receive, limit - size)
                raise
            reserved = size
        if size > limit:
            raise BodyTooLarge(f"the request body is over {limit} bytes (server.max_body_bytes)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replayed(body: bytes, then: Receive) -> Receive:
    """A `receive` that gives the already-read `body` once, whole, then defers to `then` (the client's own, for
    its disconnect, or one that says when a call is to end)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return replay


async def drain(receive: Receive, limit: int) -> None:
    """Read and drop the rest of a request body (at most `limit` bytes more): a client still sending its body reads
    the answer only once it has sent it; refused unread, it would see its connection reset instead."""
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def error_payload(message: str, type_: str, code: str | int | None = None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


async def send_bytes(send: Send, status: int, body: bytes, headers: Headers, content_type: bytes) -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send_bytes(send, status, body, list(headers), b"application/json")


async def send_error(
    send: Send, status: int, message: str, type_: str, *, code: str | int | None = None, param: str | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:  # fmt: skip
    await send_json(send, status, error_payload(message, type_, code, param), headers)


async def cancel_on_disconnect(receive: Receive, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work` (the request body already read), cancelling it if the client disconnects meanwhile: a client
    that goes away while the upstream generates, or streams, ends the upstream request too.

    asyncio's own cancellation, as `asyncio.timeout` does it: one watcher task per request, where a task group
    costs several times more (a twentieth of a proxied request)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("cancel_on_disconnect runs inside a task")
    cancelling = task.cancelling()
    left = False

    async def watch() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await work()
    except asyncio.CancelledError:
        if not left or task.uncancel() > cancelling:
            raise  # a cancellation of our caller's, not the client's leaving
    else:
        if left:  # work swallowed the cancellation; keep the task's count right
            task.uncancel()
    finally:
        watcher.cancel()
