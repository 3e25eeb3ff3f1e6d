"""A streamed answer judged in windows while it flows (issue 27.3).

Events are held until `answer.stream.window_chars` of new text have come (or the stream ends); the window, with the
last `overlap_chars` of the one before (a marker split across a window edge is still read whole), goes to the engine
while the next window fills; a window is released as soon as its verdict comes (the upstream may be silent
meanwhile: reading and releasing run side by side), in order. A tool call is held until it is complete
and is judged whole: no argument of a blocked call reaches the client. A block ends the stream with the client API's
own error event and closes the upstream; if nothing was released yet, the client gets the block's plain error.

What a block cannot take back: the windows already released (say so to whoever writes the policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from policies import AnswerGuard, AnswerVerdict, Block, Replace
from router._apis.answers import FOLLOWERS, Answered, Followed, replacement
from router._asgi.headers import Headers, encode_headers
from router._asgi.sse import EventReader, EventTooLarge, json_data
from router._errors import Blocked

Judge = Callable[[Answered], Awaitable[AnswerVerdict]]
MAX_AHEAD = 4  # windows judged at once at most; then reading waits for the oldest verdict


@dataclass(slots=True)
class _Window:
    events: list[bytes]
    verdict: asyncio.Task[AnswerVerdict]


async def split_events(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The stream's events, each with its blank-line end (router/_asgi/sse.py); one event over `limit` bytes is an
    error (the guard cannot hold it), and a last event without its end is given as it is."""
    reader = EventReader(limit, "answer.max_answer_bytes")
    async for chunk in chunks:
        for event in reader.feed(chunk):
            yield event
    rest = reader.close()
    if rest.strip():
        yield rest


async def stream_judged(
    guard: AnswerGuard,
    api: str,
    model: str,
    judge: Judge,
    chunks: AsyncIterator[bytes],
    start: Callable[[Headers], Awaitable[None]],
    send_body: Callable[[bytes], Awaitable[None]],
    stream_error: Callable[[str], bytes],
    debug: bool,
    ended: Callable[[str | None, str], None],
    on_response: Callable[[bytes], Awaitable[None]] | None = None,
) -> str:
    """Judge the stream `chunks` window by window, releasing what passes through `send_body` (after `start`, given
    the verdict's headers, before the first release); return the outcome (`pass`, `replace`, `block`, `broken`) and
    tell `ended` the outcome with the rule that stopped the stream (None when none did), a block before any release
    too. A block before any release raises `Blocked`; after it, the stream ends with `stream_error(message)`.
    `on_response` is given the data of the first event carrying the response (`response.created`) as it comes: the
    session learns a streamed answer's id before the stream ends (issue 26.4)."""
    follow = FOLLOWERS[api]
    seen = Followed()
    held: list[bytes] = []
    queue: deque[_Window] = deque()  # cut and judging (or judged), not yet released; in order
    arrival: asyncio.Future[None] | None = None  # what the releasing waits on while no window is queued
    ahead = asyncio.Semaphore(MAX_AHEAD)  # windows cut and not yet released, past which reading waits
    tail = ""
    started = False
    tags: dict[str, str] = {}
    stopped: str | None = None
    holding = 0  # bytes held in the window being filled

    async def release(window: _Window) -> str | None:
        """Send a judged window; the outcome if it ends the stream."""
        nonlocal started, stopped
        verdict = window.verdict.result()
        tags.update(verdict.tags)
        action = verdict.action
        if action is not None:
            stopped = verdict.rule
        if isinstance(action, Block):
            if not started:
                ended(stopped, "block")
                raise Blocked(action.message, status=action.status, code=verdict.rule if debug else None)
            await send_body(stream_error(action.message))
            return "block"
        if isinstance(action, Replace) and not started:
            body, _ = replacement(api, action.text, model, streamed=True)
            await start(shown_headers(verdict, tags, debug))
            started = True
            await send_body(body)
            return "replace"
        if isinstance(action, Replace):  # the text already released cannot be replaced: end it as a block
            await send_body(stream_error(action.text))
            return "block"
        if not started:
            await start(shown_headers(verdict, tags, debug))
            started = True
        for event in window.events:
            await send_body(event)
        return None

    def cut(final: bool = False) -> None:
        nonlocal tail, held, holding
        holding = 0
        if final:
            seen.close_all()
        window_text = tail + seen.text
        answered = Answered(window_text, list(seen.done))
        queue.append(_Window(held, asyncio.ensure_future(judge(answered))))
        if arrival is not None and not arrival.done():
            arrival.set_result(None)
        tail = window_text[-guard.overlap_chars :] if guard.overlap_chars else ""
        held = []
        seen.text, seen.done = "", []

    async def read() -> None:
        """Cut the stream into windows, each judged as soon as it is cut; the releasing goes on meanwhile."""
        nonlocal holding, on_response
        async for event in split_events(chunks, guard.max_answer_bytes):
            held.append(event)
            holding += len(event)
            if holding > guard.max_answer_bytes:  # a tool call that never completes is not held for ever
                raise EventTooLarge(f"more than answer.max_answer_bytes ({guard.max_answer_bytes}) held unjudged")
            data = json_data(event)
            if data is not None:
                follow(data, seen)
                if on_response is not None and isinstance(data.get("response"), dict):
                    await on_response(json.dumps(data).encode())
                    on_response = None
            if not seen.open and (seen.done or len(seen.text) >= guard.window_chars):
                cut()
                await ahead.acquire()  # at most MAX_AHEAD windows judged at once; then reading waits
        if held or seen.text or seen.open or seen.done:
            cut(final=True)

    # The reading runs beside the releasing: a window goes to the client as soon as its verdict comes, not when the
    # upstream sends its next event (issue 27.4). Only this task sends.
    reading = asyncio.ensure_future(read())
    try:
        while True:
            if queue:
                waited: set[asyncio.Future[Any]] = {queue[0].verdict}
            elif reading.done():
                break
            else:
                arrival = asyncio.get_running_loop().create_future()
                waited = {arrival}
            if not reading.done():
                waited.add(reading)
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            arrival = None
            if reading.done() and reading.exception() is not None:
                break  # a break wins over windows still waiting (they were not all judged)
            if queue and queue[0].verdict.done():
                outcome = await release(queue.popleft())
                ahead.release()
                if outcome is not None:
                    ended(stopped, outcome)
                    return outcome
        failure = reading.exception()
        if failure is not None:
            if not started or not isinstance(failure, (httpx.HTTPError, EventTooLarge)):
                raise failure  # nothing sent: the next upstream, or a 502
            await send_body(stream_error("the upstream broke off its answer"))
            ended(None, "broken")
            return "broken"
        if not started:  # an empty stream
            await start(encode_headers(tags.items()))
        ended(None, "pass")
        return "pass"
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        for window in queue:
            window.verdict.cancel()
        for window in queue:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await window.verdict


def shown_headers(verdict: AnswerVerdict, tags: Mapping[str, str], debug: bool) -> Headers:
    """The verdict's headers toward the client: its tags, and the answer rule to a caller allowed to debug."""
    headers = encode_headers(tags.items())
    if debug:
        headers.append((b"x-d3-answer-rule", (verdict.rule or "-").encode("latin-1", "replace")))
    return headers
