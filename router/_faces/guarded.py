"""A routed answer judged by its policy's answer guard (issue 27) before any of it reaches the client.

The upstream's answer is read whole (decoded, up to `answer.max_answer_bytes`), streamed or not; its text and tool
calls go to the engine with the guard's questions; then the client gets the answer as it came, the block's error in
its API's shape, or a replacement answer saying the rule's text. A stream is released whole once judged: nothing of
a withheld answer, not one argument of a blocked tool call, reaches the client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from d3backend import EngineError
from policies import AnswerGuard, AnswerVerdict, Block, Replace
from router._apis.answers import Answered, read_answer, replacement
from router._asgi.headers import HOP_BY_HOP_RAW, Headers, encode_headers
from router._asgi.relay import UpstreamBroke
from router._decision.record import D3Decision
from router._decision.service import RouterService
from router._errors import Blocked
from router._faces.request import Decided

# Re-encoded bodies lose the upstream's framing and coding: the ASGI server frames what we send.
_DROPPED = HOP_BY_HOP_RAW | {b"content-length", b"content-encoding"}
CUT = " [cut]"


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
    """Judge the answer, then send what the verdict says; return the verdict's outcome (`pass`, `replace`); a block
    raises `Blocked` (nothing was sent), a broken or oversized answer `UpstreamBroke` (the next upstream, or 502)."""
    raw = await _read(response, guard.max_answer_bytes, upstream)
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    verdict = await judge(service, guard, d3, read_answer(request.api.name, raw, streamed=streamed))
    tags = encode_headers(verdict.tags.items())
    shown = [(b"x-d3-answer-rule", (verdict.rule or "-").encode("latin-1", "replace"))] if request.debug else []
    action = verdict.action
    if isinstance(action, Block):
        service.metrics.request(d3.policy, f"answer:{verdict.rule}", "block", action.status)
        raise Blocked(action.message, status=action.status, code=verdict.rule if request.debug else None)
    if isinstance(action, Replace):
        model = request.body.get("model")
        body, kind = replacement(
            request.api.name, action.text, model if isinstance(model, str) else "", streamed=streamed
        )
        headers = [(b"content-type", kind), *extra, *tags, *shown]
        await _send(request, 200, headers, body)
        return "replace"
    if on_whole is not None and not streamed:
        await on_whole(raw)
    kept = [(k, v) for k, v in response.headers.raw if k.lower() not in _DROPPED]
    await _send(request, response.status_code, [*kept, *extra, *tags, *shown], raw)
    return "pass"


async def judge(service: RouterService, guard: AnswerGuard, d3: D3Decision, answered: Answered) -> AnswerVerdict:
    """The guard's verdict on one answer: its questions asked about the answer (and the request's state, with
    `context`); closed when the engine cannot answer, unless the guard says `on_engine_error: pass`."""
    if not guard.questions:
        return guard.evaluate({})
    text = answered.text if len(answered.text) <= guard.max_chars else answered.text[: guard.max_chars] + CUT
    state: dict[str, Any] = {}
    if guard.context:
        state["request"] = d3.state.state
    if guard.read in ("text", "both"):
        state["answer"] = text
    if guard.read in ("tool_calls", "both"):
        state["tool_calls"] = [{"name": call.name, "arguments": call.arguments} for call in answered.calls]
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


async def _send(request: Decided, status: int, headers: Headers, body: bytes) -> None:
    await request.send({"type": "http.response.start", "status": status, "headers": headers})
    await request.send({"type": "http.response.body", "body": body})
