"""`DecisionsEngine`: any decision model served with the OpenAI Decisions API (`POST {base_url}/decisions`).

    async with DecisionsEngine("https://api.example.com/v1", model="gpt-6-luna", api_key=key) as engine:
        decided = await engine.decide("Fix my Rust borrow error", {"code": Noul("Is this about code?")})
        decided.answers["code"].noul, decided.usage.cached_tokens

The questions and answers are d3backend's (`_decisions_wire.py` maps them), so policies read the same
probabilities whichever engine answered. One base URL, no retry: a hosted API balances its own servers, and a retry
after a 429 would only add to the load it refused. Errors are those of `RemoteEngine`, plus two kinds:

    a connection error          EngineUnavailable
    no answer within timeout_s  EngineTimeout
    429                         EngineRateLimited (an EngineRejected, status 429, `retry_after_s`)
    5xx (501 aside)             EngineUnavailable
    other 4xx, 501              EngineRejected (status, the body's message)
    200 with a refusal          EngineRefused (an EngineBadAnswer): the question is unanswered
    200 that is not a decision  EngineBadResponse / EngineBadAnswer

In the router every one of them ends in the policy's `on_engine_error` (router/_decision/service.py).
`PROMPT_CACHE_KEY`, a context variable, becomes the request's `prompt_cache_key` in its context (the router's
`/v1/decisions` passes its client's there); videos are refused before any call: the API takes none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar

import httpx

from d3backend._decisions_wire import DECISIONS_MAX_QUESTIONS, decisions_request, parse_decision
from d3backend._errors import EngineRateLimited, EngineRejected, EngineTimeout, EngineUnavailable
from d3backend._http import USER_AGENT, make_transport, outbound_request
from d3backend._protocol import Closing
from d3backend._remote import ENGINE_HEADERS, redact_url
from d3backend._types import Decided, Noul, Question
from d3backend._wire import JSONValue, error_message, json_bytes

PROMPT_CACHE_KEY: ContextVar[str | None] = ContextVar("d3backend_prompt_cache_key", default=None)
_PROBE_QUESTIONS: Mapping[str, Question] = {"ready": Noul("Is this text a readiness check?")}


class DecisionsEngine(Closing):
    """A decision model behind the OpenAI Decisions API at `base_url` (with its `/v1`, as the SDK's `base_url`).
    An injected `transport` is used as it is and never closed here."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not model:
            raise ValueError("DecisionsEngine needs the model name the API serves (e.g. 'gpt-6-luna')")
        self._url = base_url.rstrip("/") + "/decisions"
        self._label = redact_url(base_url.rstrip("/"))
        self._model = model
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._headers = {
            "user-agent": USER_AGENT,
            "content-type": "application/json",
            **({"authorization": f"Bearer {api_key}"} if api_key else {}),
        }
        self._owns_transport = transport is None
        self._transport = transport or make_transport()
        self._closed = False

    @property
    def model(self) -> str:
        return self._model

    @property
    def url(self) -> str:
        """The endpoint, without credentials (for logs)."""
        return self._label + "/decisions"

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        """Ask every question about `state` (text, JSON or turns; `images` as input images) in one call."""
        if not questions:
            raise ValueError("decide() needs at least one question")
        if len(questions) > DECISIONS_MAX_QUESTIONS:
            raise ValueError(f"the Decisions API takes at most {DECISIONS_MAX_QUESTIONS} questions a request")
        if videos:
            # Refused here rather than dropped: a guard must not pass a request on a video it never saw.
            raise EngineRejected(400, f"the Decisions API takes no videos; this request hands {len(videos)}")
        start = time.perf_counter()
        body = decisions_request(self._model, state, questions, images, PROMPT_CACHE_KEY.get())
        raw = await self._call(json_bytes(body))
        answers, served, usage = parse_decision(raw, questions)
        return Decided(answers, served or self._model, usage, (time.perf_counter() - start) * 1000.0)

    async def probe(self) -> Decided:
        """One small request proving the API answers decisions for the model; raises an `EngineError` saying why."""
        return await self.decide("d3-router readiness check", _PROBE_QUESTIONS)

    async def aclose(self) -> None:
        self._closed = True
        if self._owns_transport:
            await self._transport.aclose()

    async def _call(self, content: bytes) -> bytes:
        if self._closed:
            raise RuntimeError("this engine is closed")
        headers = self._headers
        extra = ENGINE_HEADERS.get()
        if extra:
            headers = {**headers, **dict(extra)}
        request = outbound_request(
            "POST", self._url, headers=headers, content=content,
            timeout_s=self._timeout_s, connect_timeout_s=self._connect_timeout_s,
        )  # fmt: skip
        try:
            # The deadline holds whatever the transport does with httpx's timeouts (as RemoteEngine's, issue 19.8).
            async with asyncio.timeout(self._timeout_s):
                response = await self._transport.handle_async_request(request)
                try:
                    status, raw, retry_after = (
                        response.status_code, await response.aread(), response.headers.get("retry-after")
                    )  # fmt: skip
                finally:
                    await response.aclose()
        except (httpx.TimeoutException, TimeoutError):
            raise EngineTimeout(
                f"the Decisions API at {self._label} did not answer within {self._timeout_s:g} s"
            ) from None
        except httpx.TransportError as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise EngineUnavailable(f"cannot reach the Decisions API at {self._label}: {detail}") from None
        if status == 200:
            return raw
        message = error_message(status, raw)
        if status == 429:
            raise EngineRateLimited(f"the Decisions API at {self._label} is rate limiting: {message}",
                                    _seconds(retry_after))  # fmt: skip
        if status >= 500 and status != 501:
            raise EngineUnavailable(f"the Decisions API at {self._label} answered {status}: {message}")
        if status == 404:
            message = f"{message} (check engine.decisions.model and engine.decisions.url, which ends in /v1)"
        elif status in (401, 403):
            message = f"{message} (check the key in engine.decisions.api_key_env)"
        raise EngineRejected(status, message)


def _seconds(value: str | None) -> float | None:
    """`Retry-After` in seconds, when it is a number (an HTTP date is not worth a parser here)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None
