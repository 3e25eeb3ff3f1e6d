"""ASGI plumbing: reading bodies with a cap, OpenAI-shaped errors, header hygiene, and relaying a streamed
upstream response to the client unbuffered, cancelling it if the client goes away."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import types
from collections.abc import AsyncIterable, Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from typing import Any, TypeVar, cast

import httpx
from starlette.types import Receive, Send

logger = logging.getLogger(__name__)

# RFC 9110 7.6.1 hop-by-hop headers, and those the proxy sets itself.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
     "trailers", "transfer-encoding", "upgrade"}
)  # fmt: skip
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
HOP_BY_HOP_RAW = frozenset(name.encode() for name in HOP_BY_HOP)
NOT_FORWARDED_RAW = frozenset(name.encode() for name in NOT_FORWARDED)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")

Headers = list[tuple[bytes, bytes]]
T = TypeVar("T")


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes (server.max_body_bytes)")


class ClientDisconnected(Exception):
    """The client went away before its request body was complete: there is no one left to answer."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; `BodyTooLarge` as soon as it passes `limit` bytes, `ClientDisconnected` if the
    client leaves first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def header_value(value: str) -> bytes:
    """A header value that cannot break the response: no control characters, Latin-1 only."""
    return _UNSAFE.sub(" ", value).encode("latin-1", "replace")


def encode_headers(pairs: Iterable[tuple[str, str]]) -> Headers:
    """Each pair lower-cased and made safe (`header_value`). A pair is encoded once and then looked up: a route's
    `x-d3-*` headers repeat from one request to the next (a fifth of the headers' cost, measured)."""
    encoded = []
    for pair in pairs:
        found = _ENCODED.get(pair)
        if found is None:
            if len(_ENCODED) >= _ENCODED_MAX:  # values from requests (decision times, tags) must not grow it
                _ENCODED.clear()
            found = _ENCODED[pair] = (pair[0].lower().encode("latin-1"), header_value(pair[1]))
        encoded.append(found)
    return encoded


_ENCODED: dict[tuple[str, str], tuple[bytes, bytes]] = {}
_ENCODED_MAX = 4096


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
    assert task is not None
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


async def within(timeout_s: float, work: Coroutine[Any, Any, T]) -> T:
    """`await work` under `asyncio.timeout(timeout_s)`, the timer armed only once `work` first waits: a decision
    from the cache returns without ever waiting, and arming and cancelling a timer for it was a twelfth of a cache
    hit's time in the proxy (benchmarks/router.py). A `work` that waits gets the whole budget from that moment."""
    try:
        waiting = work.send(None)  # run it up to its first wait, as the task itself would
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except BaseException:
        work.close()
        raise
    async with asyncio.timeout(timeout_s):
        return await _go_on(work, waiting)


@types.coroutine
def _go_on(work: Coroutine[Any, Any, T], waiting: Any) -> Generator[Any, Any, T]:
    """Go on with `work`, stopped at its first wait on `waiting`: hand what it waits on to the task, and the task's
    answer (a value, a cancellation) back to it, as `await` would."""
    while True:
        try:
            value = yield waiting
        except GeneratorExit:
            work.close()
            raise
        except BaseException as exc:  # the task's cancellation goes on into `work`
            try:
                waiting = work.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            continue
        try:
            waiting = work.send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


BUFFER_LIMIT = 1024 * 1024


async def relay(
    response: httpx.Response,
    send: Send,
    extra: Headers,
    upstream: str = "upstream",
    on_whole: Callable[[bytes], Awaitable[None]] | None = None,
) -> bool:
    """Send `response` to the client: status, headers (hop-by-hop removed), raw bytes. An event stream goes on as it
    arrives, unbuffered. Any other body is read whole first (up to `BUFFER_LIMIT`, then streamed), so an upstream
    that breaks off mid-way raises `UpstreamBroke` while nothing has reached the client, and the caller can try
    another upstream or answer 502. Once started, a break logs one warning, leaves the response incomplete (the
    server closes the connection: the client sees the cut) and returns False. The upstream response is closed.
    A body read whole is given to `on_whole` before the client has it (the session of a Responses answer's id: stored
    before the client can send its next turn, perhaps to another replica)."""
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP_RAW] + extra
    start = {"type": "http.response.start", "status": response.status_code, "headers": headers}
    # The transport's own stream, not `aiter_raw()`: the bytes are the same, without httpx's generator, chunker and
    # error context around each chunk. The upstream response is closed as soon as its body is read, before the
    # client's answer ends, as `aiter_raw()` did: once it ends, the disconnect watcher (`cancel_on_disconnect`) may
    # cancel this task, and a close that waits (httpx's own pool) would be cut short and leak its connection.
    stream = cast(AsyncIterable[bytes], response.stream).__aiter__()  # one iterator: the loops below go on in it
    chunks: list[bytes] = []
    try:
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
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
                    if on_whole is not None:
                        await on_whole(body)
                    await send(start)
                    await send({"type": "http.response.body", "body": body})
                    return True
            except httpx.HTTPError as exc:
                raise UpstreamBroke(f"upstream {upstream!r} broke off its response: {type(exc).__name__}") from exc
        await send(start)
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        try:
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            logger.warning("upstream %r broke off its response mid-way (%s); the client's response is cut short",
                           upstream, type(exc).__name__)  # fmt: skip
            return False
        await response.aclose()  # before the answer ends (see above)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True
    finally:
        await response.aclose()


class UpstreamBroke(Exception):
    """The upstream's body stopped before any of it reached the client; the message says which and how."""
