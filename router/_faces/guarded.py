"""A routed answer judged by its policy's answer guard (issue 27) before any of it reaches the client.

The upstream's answer is read whole (decoded, up to `answer.max_answer_bytes`), streamed or not; its text and tool
calls go to the engine with the guard's questions; then the client gets the answer as it came, the block's error in
its API's shape, or a replacement answer saying the rule's text. A stream is released whole once judged: nothing of
a withheld answer, not one argument of a blocked tool call, reaches the client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.types import Message, Send

from d3backend import EngineError
from policies import AnswerGuard, AnswerVerdict, Block, Replace
from router._apis.answers import Answered, Call, read_answer, replacement
from router._asgi.headers import HOP_BY_HOP_RAW, Headers, encode_headers
from router._asgi.relay import UpstreamBroke
from router._decision.record import D3Decision
from router._decision.service import RouterService
from router._errors import Blocked, RequestError, UpstreamFailed
from router._faces.request import Decided
from router._faces.windows import EventTooLarge, stream_judged

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
) -> str:
    """The proxy's way: read the upstream's answer whole, judge it, send what the verdict says; return `pass` or
    `replace`. A block raises `Blocked` (nothing was sent), a broken or oversized answer `UpstreamBroke` (the next
    upstream, or 502)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return await _stream(service, guard, request, d3, response, extra, upstream, on_whole)
    raw = await _read(response, guard.max_answer_bytes, upstream)
    status, headers, body, outcome = await judged(
        service, guard, request, d3, response.status_code, [*response.headers.raw, *extra], raw
    )
    if outcome == "pass" and on_whole is not None and not _streamed(headers):
        await on_whole(raw)
    await request.send({"type": "http.response.start", "status": status, "headers": headers})
    await request.send({"type": "http.response.body", "body": body})
    return outcome


async def _stream(
    service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, response: httpx.Response,
    extra: Headers, upstream: str, on_response: Callable[[bytes], Awaitable[None]] | None,
) -> str:  # fmt: skip
    """A streamed answer judged in windows as it flows (router/_faces/windows.py); `on_response` learns a streamed
    Responses answer's id from its first event, as `relay` does."""
    kept = [(k, v) for k, v in response.headers.raw if k.lower() not in _DROPPED]

    async def start(tags: Headers) -> None:
        await request.send({"type": "http.response.start", "status": response.status_code,
                            "headers": [*kept, *extra, *tags]})  # fmt: skip

    async def send_body(body: bytes) -> None:
        await request.send({"type": "http.response.body", "body": body, "more_body": True})

    def ended(rule: str | None, outcome: str) -> None:
        service.metrics.answer_verdicts[(d3.policy, rule or "-", outcome)] += 1

    model = request.body.get("model")
    try:
        outcome = await stream_judged(
            guard, request.api.name, model if isinstance(model, str) else "",
            lambda answered: judge(service, guard, d3, answered), response.aiter_bytes(), start, send_body,
            request.api.stream_error, request.debug,
            ended, on_response,
        )  # fmt: skip
    except httpx.HTTPError as exc:
        raise UpstreamBroke(f"upstream {upstream!r} broke off its response: {type(exc).__name__}") from exc
    except EventTooLarge as exc:
        raise UpstreamBroke(str(exc)) from exc
    finally:
        await response.aclose()
    await request.send({"type": "http.response.body", "body": b""})
    return outcome


async def judged(
    service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, status: int, headers: Headers,
    raw: bytes,
) -> tuple[int, Headers, bytes, str]:  # fmt: skip
    """What the client gets for the decoded answer `raw` (`status`, `headers` as the answer came): the answer itself
    (hop-by-hop, length and coding headers dropped), or a replacement, with the verdict's tags; a block raises
    `Blocked`."""
    streamed = _streamed(headers)
    verdict = await judge(service, guard, d3, read_answer(request.api.name, raw, streamed=streamed))
    tags = encode_headers(verdict.tags.items())
    if request.debug:
        tags.append((b"x-d3-answer-rule", (verdict.rule or "-").encode("latin-1", "replace")))
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
    return status, [*kept, *tags, (b"content-length", str(len(raw)).encode())], raw, "pass"


def _streamed(headers: Headers) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


async def judge(service: RouterService, guard: AnswerGuard, d3: D3Decision, answered: Answered) -> AnswerVerdict:
    """The guard's verdict on one answer: its questions asked about the answer (and the request's state, with
    `context`); closed when the engine cannot answer, unless the guard says `on_engine_error: pass`.

    A text longer than `max_chars` is judged in slices of `max_chars` overlapping by up to `overlap_chars`, all at
    once (nothing is cut unread: a marker at the end of a long answer is read too); the first slice that a rule
    stops decides, tool calls are judged with the first slice."""
    if not guard.questions:
        return guard.evaluate({})
    verdicts = await asyncio.gather(*(_ask(service, guard, d3, text, answered.calls if first else [])
                                      for first, text in _slices(answered.text, guard)))  # fmt: skip
    tags: dict[str, str] = {}
    for verdict in verdicts:
        tags.update(verdict.tags)
        if verdict.action is not None or verdict.degraded:
            return dataclasses.replace(verdict, tags=tags)
    return dataclasses.replace(verdicts[-1], tags=tags)


def _slices(text: str, guard: AnswerGuard) -> list[tuple[bool, str]]:
    size = guard.max_chars
    if len(text) <= size:
        return [(True, text)]
    step = size - min(guard.overlap_chars, size // 2)
    return [(at == 0, text[at : at + size]) for at in range(0, len(text) - size + step, step)]


async def _ask(service: RouterService, guard: AnswerGuard, d3: D3Decision, text: str, calls: list[Call]
               ) -> AnswerVerdict:  # fmt: skip
    state: dict[str, Any] = {}
    if guard.context:
        state["request"] = d3.state.state
    if guard.read in ("text", "both"):
        state["answer"] = text
    if guard.read in ("tool_calls", "both"):
        state["tool_calls"] = [{"name": call.name, "arguments": call.arguments} for call in calls]
    service.metrics.answer_judgements[d3.policy] += 1
    try:
        decided = await service.ask(state, guard.questions)
    except (EngineError, TimeoutError):
        return guard.engine_failed()
    return guard.evaluate(decided.answers)


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


def judging(service: RouterService, guard: AnswerGuard, request: Decided, d3: D3Decision, send: Send) -> Send:
    """The middleware's way: a `send` for the app that holds its answer (up to `answer.max_answer_bytes`), judges it
    whole, then sends through `send` what the verdict says; a block or an oversized answer is answered in the API's
    shape instead (`request.fail`). An error answer (3xx and up) goes on as it comes."""
    start: Message | None = None
    parts: list[bytes] = []
    size = 0
    state = "holding"  # holding -> as-is (an error answer) | done

    async def judging_send(message: Message) -> None:
        nonlocal start, size, state
        if state == "as-is":
            await send(message)
            return
        if state == "done":
            return
        if message["type"] == "http.response.start":
            if message["status"] >= 300:
                state = "as-is"
                await send(message)
            else:
                start = message
            return
        if message["type"] != "http.response.body" or start is None:
            await send(message)
            return
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > guard.max_answer_bytes:
            state = "done"
            limit = guard.max_answer_bytes
            await request.fail(UpstreamFailed(f"the app answered more than answer.max_answer_bytes ({limit}) for the "
                                              "answer guard to judge", status=502))  # fmt: skip
            return
        parts.append(chunk)
        if message.get("more_body", False):
            return
        state = "done"
        headers: Headers = list(start.get("headers", []))
        try:
            raw = decoded(b"".join(parts), headers)
            status, kept, body, _ = await judged(service, guard, request, d3, start["status"], headers, raw)
        except RequestError as exc:
            await request.fail(exc, encode_headers(d3.headers(full=request.debug)))
            return
        await send({"type": "http.response.start", "status": status, "headers": kept})
        await send({"type": "http.response.body", "body": body})

    return judging_send


def decoded(raw: bytes, headers: Headers) -> bytes:
    """`raw` decoded as its content-encoding says (gzip, deflate, identity); any other coding is refused (502): the
    guard must read what the client would."""
    codings = [v.decode("latin-1").strip().lower() for k, v in headers if k.lower() == b"content-encoding"]
    for coding in reversed([c.strip() for value in codings for c in value.split(",") if c.strip()]):
        try:
            if coding in ("gzip", "x-gzip"):
                raw = gzip.decompress(raw)
            elif coding == "deflate":
                raw = zlib.decompress(raw)
            elif coding != "identity":
                raise UpstreamFailed(f"the answer's content-encoding {coding!r} cannot be judged; send it as gzip, "
                                     "deflate or uncoded", status=502)  # fmt: skip
        except (OSError, EOFError, zlib.error) as exc:
            raise UpstreamFailed(f"the answer's {coding} encoding is broken", status=502) from exc
    return raw
