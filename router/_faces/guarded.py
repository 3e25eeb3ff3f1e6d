"""A routed answer judged by its policy's answer guard (issue 27) before any of it reaches the client.

The upstream's answer is read whole (decoded, up to `answer.max_answer_bytes`), streamed or not; its text and tool
calls go to the engine with the guard's questions; then the client gets the answer as it came, the block's error in
its API's shape, or a replacement answer saying the rule's text. A stream is judged in windows as it flows
(router/_faces/windows.py): nothing of a withheld window, not one argument of a blocked tool call, reaches the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from starlette.types import Message, Send

from policies import AnswerGuard, AnswerVerdict, Block, Replace
from router._apis.answers import Answered, read_answer, replacement
from router._asgi.answer import Rename
from router._asgi.answer import decoded as decoded_answer
from router._asgi.headers import HOP_BY_HOP_RAW, Headers, encode_headers
from router._asgi.relay import Reads, UpstreamBroke
from router._asgi.sse import EventTooLarge
from router._decision.judge import judge
from router._decision.record import D3Decision
from router._decision.service import RouterService
from router._errors import Blocked, RequestError, UpstreamFailed
from router._faces.request import Decided
from router._faces.windows import shown_headers, stream_judged

logger = logging.getLogger(__name__)

# Re-encoded bodies lose the upstream's framing and coding: the ASGI server frames what we send.
_DROPPED = HOP_BY_HOP_RAW | {b"content-length", b"content-encoding"}


async def relay_judged(
    service: RouterService,
    guard: AnswerGuard,
    request: Decided,
    d3: D3Decision,
    response: httpx.Response,
    extra: Headers,
    upstream: str,
    on_whole: Callable[[bytes], Awaitable[None]] | None,
    rename: Rename | None = None,
    usage: Reads | None = None,
) -> str:
    """The proxy's way: read the upstream's answer whole, judge it, send what the verdict says; return `pass` or
    `replace`. A block raises `Blocked` (nothing was sent), a broken or oversized answer `UpstreamBroke` (the next
    upstream, or 502). `usage` reads the answer's tokens, as `relay` has it do (router/_asgi/relay.py)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return await _stream(service, guard, request, d3, response, extra, upstream, on_whole, rename, usage)
    raw = await _read(response, guard.max_answer_bytes, upstream)
    if usage is not None:
        usage.body(raw)
    status, headers, body, outcome = await judged(
        service, guard, request, d3, response.status_code, [*response.headers.raw, *extra], raw, rename
    )
    if outcome == "pass" and on_whole is not None and not _streamed(headers):
        await on_whole(raw)
    await request.send({"type": "http.response.start", "status": status, "headers": headers})
    await request.send({"type": "http.response.body", "body": body})
    return outcome


async def _stream(
    service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, response: httpx.Response,
    extra: Headers, upstream: str, on_response: Callable[[bytes], Awaitable[None]] | None, rename: Rename | None,
    usage: Reads | None = None,
) -> str:  # fmt: skip
    """The proxy's streamed answer, judged in windows; `on_response` learns a streamed Responses answer's id from its
    first event, as `relay` does. Nothing sent yet when it breaks: `UpstreamBroke` (the next upstream, or 502)."""
    headers = [*response.headers.raw, *extra]
    try:
        chunks = response.aiter_bytes()
        if usage is not None:  # decoded chunks: the watch reads them whatever the content-encoding
            chunks = _watched(chunks, usage)
        return await stream(service, guard, request, d3, response.status_code, headers, chunks, request.send, rename,
                            on_response)  # fmt: skip
    except httpx.HTTPError as exc:
        raise UpstreamBroke(f"upstream {upstream!r} broke off its response: {type(exc).__name__}") from exc
    except EventTooLarge as exc:
        raise UpstreamBroke(str(exc)) from exc
    finally:
        await response.aclose()


async def _watched(chunks: AsyncIterator[bytes], usage: Reads) -> AsyncIterator[bytes]:
    """`chunks` as the usage's `Watch` lets them on (the usage chunk the router asked for cut out)."""
    watch = usage.watch()
    async for chunk in chunks:
        out = watch.feed(chunk)
        if out:
            yield out
    last = watch.flush()
    if last:
        yield last


async def stream(
    service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, status: int, headers: Headers,
    chunks: AsyncIterator[bytes], send: Send, rename: Rename | None = None,
    on_response: Callable[[bytes], Awaitable[None]] | None = None,
) -> str:  # fmt: skip
    """An event stream (`status`, `headers` as it came, its decoded `chunks`) judged in windows and sent through
    `send` as the verdicts say (both faces: the proxy's upstream, the middleware's app); the answer renamed to the
    client's model with `rename`. A block before any release raises `Blocked`, an event over the bound
    `EventTooLarge`."""
    kept = [(k, v) for k, v in headers if k.lower() not in _DROPPED]

    async def start(tags: Headers) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [*kept, *tags]})

    async def send_body(body: bytes) -> None:
        out = body if rename is None else rename.feed(body)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})

    def ended(rule: str | None, outcome: str) -> None:
        service.metrics.answer_verdicts[(d3.policy, rule or "-", outcome)] += 1

    windows = itertools.count()  # windows are cut, and so judged, in order

    def judging(answered: Answered) -> Awaitable[AnswerVerdict]:
        return judge(service, guard, d3, answered, request_id=request.request_id, caller=request.caller.id,
                     window=next(windows))  # fmt: skip

    model = request.body.get("model")
    outcome = await stream_judged(
        guard, request.api.name, model if isinstance(model, str) else "", judging, chunks, start, send_body,
        request.api.stream_error, request.debug, ended, on_response,
    )  # fmt: skip
    await send({"type": "http.response.body", "body": b"" if rename is None else rename.flush()})
    return outcome


async def judged(
    service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, status: int, headers: Headers,
    raw: bytes, rename: Rename | None = None,
) -> tuple[int, Headers, bytes, str]:  # fmt: skip
    """What the client gets for the decoded answer `raw` (`status`, `headers` as the answer came): the answer itself
    (hop-by-hop, length and coding headers dropped), or a replacement, with the verdict's tags; a block raises
    `Blocked`."""
    streamed = _streamed(headers)
    verdict = await judge(
        service,
        guard,
        d3,
        read_answer(request.api.name, raw, streamed=streamed),
        request_id=request.request_id,
        caller=request.caller.id,
    )
    tags = shown_headers(verdict, verdict.tags, request.debug)
    action = verdict.action
    outcome = "pass" if action is None else action.kind
    service.metrics.answer_verdicts[(d3.policy, verdict.rule or "-", outcome)] += 1
    if isinstance(action, Block):
        raise Blocked(action.message, status=action.status, code=verdict.rule if request.debug else None)
    kept = [(k, v) for k, v in headers if k.lower() not in _DROPPED]
    if isinstance(action, Replace):
        model = request.body.get("model")
        named = model if isinstance(model, str) else ""
        body, kind = replacement(request.api.name, action.text, named, streamed=streamed)
        kept = [(k, v) for k, v in kept if k.lower() != b"content-type"]
        kept = [(b"content-type", kind), *kept]
        return 200, [*kept, *tags, (b"content-length", str(len(body)).encode())], body, "replace"
    body = raw if rename is None else rename.body(raw)  # the answer names the client's model
    return status, [*kept, *tags, (b"content-length", str(len(body)).encode())], body, "pass"


def _streamed(headers: Headers) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


async def _read(response: httpx.Response, limit: int, upstream: str) -> bytes:
    """The answer whole, decoded (a guard must read what the client would), or `UpstreamBroke`."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise UpstreamBroke(f"upstream {upstream!r} answered more than answer.max_answer_bytes ({limit}) "
                                    "for the answer guard to judge")  # fmt: skip
            chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise UpstreamBroke(f"upstream {upstream!r} broke off its response: {type(exc).__name__}") from exc
    finally:
        await response.aclose()
    return b"".join(chunks)


class Judging:
    """The middleware's way: `send` is given to the app; its answer is judged before the client has any of it, then
    sent through the inner `send` as the verdict says. A whole answer is held (up to `answer.max_answer_bytes`) and
    judged at once; an event stream (not content-coded) is judged in windows while it flows, as the proxy does; a
    block or an oversized answer is answered in the API's shape instead. An error answer (3xx and up) goes on as it
    comes. `aclose()` after the app returned stops what is still judging."""

    def __init__(self, service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, send: Send):
        self.service, self.guard, self.request, self.d3, self.inner = service, guard, request, d3, send
        self._start: Message | None = None
        self._parts: list[bytes] = []
        self._size = 0
        self._state = "holding"  # holding | windows | as-is (an error answer) | done
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def send(self, message: Message) -> None:
        if self._state == "as-is":
            await self.inner(message)
            return
        if self._state == "done":
            return
        if message["type"] == "http.response.start":
            headers: Headers = list(message.get("headers", []))
            if message["status"] >= 300:
                self._state = "as-is"
                await self.inner(message)
            elif _streamed(headers) and not any(k.lower() == b"content-encoding" for k, _ in headers):
                self._state = "windows"
                self._task = asyncio.ensure_future(self._windows(message))
            else:
                self._start = message
            return
        if message["type"] != "http.response.body" or self._state not in ("holding", "windows"):
            await self.inner(message)
            return
        chunk = message.get("body", b"")
        self._size += len(chunk)
        if self._state == "windows" and self._task is not None:
            if not self._task.done():
                self._queue.put_nowait(chunk)  # the windows' own bound (max_answer_bytes a held event) applies
                if not message.get("more_body", False):
                    self._queue.put_nowait(None)
                    self._state = "done"
                    await self._task
            return
        if self._size > self.guard.max_answer_bytes:
            self._state = "done"
            limit = self.guard.max_answer_bytes
            await self.request.fail(UpstreamFailed(f"the app answered more than answer.max_answer_bytes ({limit}) "
                                                   "for the answer guard to judge", status=502))  # fmt: skip
            return
        self._parts.append(chunk)
        if message.get("more_body", False):
            return
        self._state = "done"
        start = self._start or {"status": 200, "headers": []}
        headers = list(start.get("headers", []))
        try:
            raw = decoded(b"".join(self._parts), headers)
            status, kept, body, _ = await judged(self.service, self.guard, self.request, self.d3, start["status"],
                                                 headers, raw)  # fmt: skip
        except RequestError as exc:
            await self.request.fail(exc, encode_headers(self.d3.headers(full=self.request.debug)))
            return
        await self.inner({"type": "http.response.start", "status": status, "headers": kept})
        await self.inner({"type": "http.response.body", "body": body})

    async def _windows(self, start: Message) -> None:
        async def chunks() -> AsyncIterator[bytes]:
            while (chunk := await self._queue.get()) is not None:
                yield chunk

        request, d3 = self.request, self.d3
        try:
            await stream(self.service, self.guard, request, d3, start["status"], list(start.get("headers", [])),
                         chunks(), self.inner)  # fmt: skip
        except Blocked as exc:
            await request.fail(exc, encode_headers(d3.headers(full=request.debug)))
        except EventTooLarge as exc:
            await request.fail(UpstreamFailed(str(exc), status=502))

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def decoded(raw: bytes, headers: Headers) -> bytes:
    """`raw` decoded as its content-encoding says (gzip, deflate, identity: router/_asgi/answer.py); any other coding,
    or broken bytes, is refused (502): the guard must read what the client would."""
    plain = decoded_answer(raw, headers)
    if plain is None:
        raise UpstreamFailed("the answer's content-encoding cannot be judged (only gzip, deflate or none) or its "
                             "bytes are broken", status=502)  # fmt: skip
    return plain[0]
