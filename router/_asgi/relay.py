"""Relaying an upstream's response to the client: an event stream unbuffered, any other body read whole first
(up to `BUFFER_LIMIT`) so an upstream that breaks off can still be answered for.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Protocol, cast

import httpx
from starlette.types import Send

from router._asgi.answer import Rename, Watch, resized
from router._asgi.answer import decoded as decoded_answer
from router._asgi.decoding import Decoder, FirstResponse, decoded
from router._asgi.headers import HOP_BY_HOP_RAW, Headers
from router._asgi.sse import ends_event

logger = logging.getLogger(__name__)

BUFFER_LIMIT = 1024 * 1024


class Reads(Protocol):
    """What reads an answer's usage on its way (router/_apis/usage.py `UsageReader`)."""

    def body(self, raw: bytes) -> None: ...

    def watch(self) -> Watch: ...


async def relay(
    response: httpx.Response,
    send: Send,
    extra: Headers,
    upstream: str = "upstream",
    on_whole: Callable[[bytes], Awaitable[None]] | None = None,
    ending: Callable[[], bytes] | None = None,
    rename: Rename | None = None,
    usage: Reads | None = None,
) -> bool:
    """Send `response` to the client: status, headers (hop-by-hop removed), raw bytes. An event stream goes on as it
    arrives, unbuffered. Any other body is read whole first (up to `BUFFER_LIMIT`, then streamed), so an upstream
    that breaks off mid-way raises `UpstreamBroke` while nothing has reached the client, and the caller can try
    another upstream or answer 502. Once started, a break logs one warning and returns False: an event stream ends
    with what `ending()` makes (the client API's error event: the SDKs raise it instead of a cut connection), any
    other body is left incomplete (the server closes the connection: the client sees the cut). The upstream response
    is closed. A body read whole is given to `on_whole` before the client has it (the session of a Responses answer's
    id: stored before the client can send its next turn, perhaps to another replica), decoded whatever its
    `Content-Encoding`; of an event stream, `on_whole` is given the data of the first event carrying the response
    (`response.created`) as soon as it has come, before that event goes on to the client (issue 26.4). With
    `rename`, the answer names the client's model (router/_asgi/answer.py): a JSON body read whole (gzip or deflate
    decoded first), an event stream event by event; a body over `BUFFER_LIMIT` passes as it came. `usage` reads the
    answer's tokens as it goes (a JSON body whole, decoded; a stream through its `Watch`, which may cut out the usage
    chunk the router asked for), changing nothing else."""
    raw = response.headers.raw
    named = {token.strip().lower() for k, v in raw if k.lower() == b"connection" for token in v.split(b",")}
    headers = [(k, v) for k, v in raw if k.lower() not in HOP_BY_HOP_RAW and k.lower() not in named] + extra
    start = {"type": "http.response.start", "status": response.status_code, "headers": headers}
    # The transport's own stream, not `aiter_raw()`: the bytes are the same, without httpx's generator, chunker and
    # error context around each chunk. The upstream response is closed as soon as its body is read, before the
    # client's answer ends, as `aiter_raw()` did: once it ends, the disconnect watcher (`cancel_on_disconnect`) may
    # cancel this task, and a close that waits (httpx's own pool) would be cut short and leak its connection.
    stream = cast(AsyncIterable[bytes], response.stream).__aiter__()  # one iterator: the loops below go on in it
    chunks: list[bytes] = []
    events = response.headers.get("content-type", "").startswith("text/event-stream")
    try:
        if not events:
            size = 0
            try:
                async for chunk in stream:
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > BUFFER_LIMIT:
                        break
                else:
                    await response.aclose()  # before the answer ends (see above)
                    body = b"".join(chunks)
                    readable = None
                    if rename is not None and (plain := decoded_answer(body, headers)) is not None:
                        body = readable = rename.body(plain[0])  # sent decoded
                        start["headers"] = headers = resized(plain[1], len(body))
                    if on_whole is not None or usage is not None:
                        if readable is None:
                            readable = decoded(body, response.headers.get("content-encoding", ""))
                        if readable is not None:
                            if usage is not None:
                                usage.body(readable)
                            if on_whole is not None:
                                await on_whole(readable)
                    await send(start)
                    await send({"type": "http.response.body", "body": body})
                    return True
            except httpx.HTTPError as exc:
                raise UpstreamBroke(f"upstream {upstream!r} broke off its response: {type(exc).__name__}") from exc
        watch = None
        if not events or response.headers.get("content-encoding", "identity") != "identity":
            rename = None  # too large to hold, or encoded: as it came (its usage unread)
        else:
            watch = usage.watch() if usage is not None else None
        if rename is not None or (watch is not None and watch.hold):
            start["headers"] = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        await send(start)
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        last = chunks[-1] if chunks else b"\n\n"
        peek = None
        if events and on_whole is not None:
            peek, seen = FirstResponse(Decoder(response.headers.get("content-encoding", ""))), on_whole
        try:
            async for last in stream:
                if peek is not None and not peek.done:
                    data = peek.feed(last)
                    if data is not None:
                        await seen(data)
                out = last if watch is None else watch.feed(last)
                out = out if rename is None else rename.feed(out)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except httpx.HTTPError as exc:
            logger.warning("upstream %r broke off its response mid-way (%s); the client's response ends there",
                           upstream, type(exc).__name__)  # fmt: skip
            if not events or ending is None:  # only the cut says it
                return False
            # An event cut in two is closed first, so that the error is an event of its own.
            held = b"" if watch is None else watch.flush()
            held = held if rename is None else rename.feed(held) + rename.flush()
            tail = b"" if ends_event(last) else b"\n\n"
            await send({"type": "http.response.body", "body": held + tail + ending(), "more_body": False})
            return False
        await response.aclose()  # before the answer ends (see above)
        held = b"" if watch is None else watch.flush()
        last = held if rename is None else rename.feed(held) + rename.flush()
        await send({"type": "http.response.body", "body": last, "more_body": False})
        return True
    finally:
        await response.aclose()


class UpstreamBroke(Exception):
    """The upstream's body stopped before any of it reached the client; the message says which and how."""
