"""`RemoteEngine`: one or more vLLM servers answering `/v1/systemone` over HTTP.

    async with RemoteEngine(["http://d3-a:8000", "http://d3-b:8000"], model="vllm-sr/d3-mini") as engine:
        decided = await engine.decide("Fix my Rust borrow error", {"kind": Choice(None, {"code": None, "chat": None})})
        decided.answers["kind"].choice

Calls go to the healthy URL with the fewest requests in flight. A connection error, a timeout, a 5xx or a 429 is
retried once on another URL. Each try must answer within `timeout_s`, whatever the transport. A URL that fails
twice in a row is set aside for a backoff that doubles with each further failure (1 s up to 30 s by default); the
first request after the backoff tries it again.

`ENGINE_HEADERS`, a context variable, adds headers to the engine requests made in its context: the router puts the
W3C `traceparent` of its engine span there (router/_tracing.py), so d3backend needs no tracing library.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import httpx

from d3backend._errors import EngineBadResponse, EngineError, EngineRejected, EngineTimeout, EngineUnavailable
from d3backend._http import USER_AGENT, make_transport, outbound_request
from d3backend._protocol import Closing
from d3backend._types import Decided, Noul, Question
from d3backend._wire import JSONValue, error_message, parse_response, request_body

_PROBE_QUESTIONS: Mapping[str, Question] = {"ready": Noul("Is this text a readiness check?")}
_FAILURES_BEFORE_SET_ASIDE = 2
ENGINE_HEADERS: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("d3backend_engine_headers", default=())


@dataclass(slots=True)
class _Endpoint:
    url: str
    in_flight: int = 0
    failures: int = 0  # consecutive
    down_until: float = 0.0


class RemoteEngine(Closing):
    """A decision engine reached over HTTP. `model` is the served model name; unset, it is read from
    `/v1/models`. An injected `transport` is used as it is and never closed here.

    Requests go to the transport directly: an engine call needs none of an httpx client's cookies, redirects or
    auth, and skipping them halves the client's share of a call (benchmarks/router.py)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        timeout_s: float = 2.0,
        connect_timeout_s: float = 0.5,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        if not urls:
            raise ValueError("RemoteEngine needs at least one URL")
        self._endpoints = [_Endpoint(url.rstrip("/")) for url in urls]
        self._model = model
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._headers = {"user-agent": USER_AGENT, **({"authorization": f"Bearer {api_key}"} if api_key else {})}
        self._json_headers = {**self._headers, "content-type": "application/json"}
        self._owns_transport = transport is None
        self._transport = transport or make_transport()
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._model_lock = asyncio.Lock()
        self._closed = False

    @property
    def model(self) -> str | None:
        """The served model name, once configured or discovered."""
        return self._model

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(endpoint.url for endpoint in self._endpoints)

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        """Ask every question about `state` in one engine call."""
        if not questions:
            raise ValueError("decide() needs at least one question")
        start = time.perf_counter()
        model = self._model or await self._discover_model()
        raw = await self._call("POST", "/v1/systemone", request_body(model, state, questions, images, videos))
        answers, served, usage = parse_response(raw, questions)
        return Decided(answers, served or model, usage, (time.perf_counter() - start) * 1000.0)

    async def probe(self) -> Decided:
        """One small fixed request proving the engine serves decisions; raises an `EngineError` saying why not."""
        return await self.decide("d3-router readiness check", _PROBE_QUESTIONS)

    async def aclose(self) -> None:
        self._closed = True
        if self._owns_transport:
            await self._transport.aclose()

    # --- internals ---------------------------------------------------------------------------------------------
    async def _discover_model(self) -> str:
        async with self._model_lock:
            if self._model is None:
                raw = await self._call("GET", "/v1/models", None)
                try:
                    self._model = str(json.loads(raw)["data"][0]["id"])
                except (ValueError, KeyError, IndexError, TypeError):
                    raise EngineBadResponse("the engine's /v1/models lists no model; set the model name") from None
            return self._model

    async def _call(self, method: str, path: str, content: bytes | None) -> bytes:
        if self._closed:
            raise RuntimeError("this engine is closed")
        tried: list[_Endpoint] = []
        error: EngineError | None = None
        for _ in range(2):  # one try, and one retry on another URL
            endpoint = self._pick(tried)
            if endpoint is None:
                break
            tried.append(endpoint)
            endpoint.in_flight += 1
            try:
                # The deadline is enforced here, not only through httpx's timeouts: a transport may ignore those
                # (httpx.ASGITransport, the embedded engine's, does), and a hung call would pin the cache's
                # single-flight entry for its key (issue 19.8). Cancelling the send cancels the transport's work.
                async with asyncio.timeout(self._timeout_s):
                    status, body = await self._send(method, endpoint.url, path, content)
            except (httpx.TimeoutException, TimeoutError):
                error = EngineTimeout(f"the engine at {endpoint.url} did not answer within {self._timeout_s:g} s")
                self._failed(endpoint)
                continue
            except httpx.TransportError as exc:
                error = EngineUnavailable(f"cannot reach the engine at {endpoint.url}: {_describe(exc)}")
                self._failed(endpoint)
                continue
            finally:
                endpoint.in_flight -= 1
            if status == 200:
                self._succeeded(endpoint)
                return body
            message = error_message(status, body)
            if status == 429 or (status >= 500 and status != 501):
                error = EngineUnavailable(f"the engine at {endpoint.url} answered {status}: {message}")
                self._failed(endpoint)
                continue
            self._succeeded(endpoint)  # it is up; the request is what it refused
            raise EngineRejected(status, _with_hint(status, message))
        if error is None:
            wait = min(endpoint.down_until for endpoint in self._endpoints) - time.monotonic()
            error = EngineUnavailable(
                f"every engine URL failed repeatedly and is set aside; the next try is in {max(wait, 0):.1f} s"
            )
        raise error

    async def _send(self, method: str, base: str, path: str, content: bytes | None) -> tuple[int, bytes]:
        headers = self._headers if content is None else self._json_headers
        extra = ENGINE_HEADERS.get()
        if extra:
            headers = {**headers, **dict(extra)}
        request = outbound_request(
            method, base + path, headers=headers, content=content,
            timeout_s=self._timeout_s, connect_timeout_s=self._connect_timeout_s,
        )  # fmt: skip
        response = await self._transport.handle_async_request(request)
        try:
            return response.status_code, await response.aread()
        finally:
            await response.aclose()

    def _pick(self, tried: list[_Endpoint]) -> _Endpoint | None:
        now = time.monotonic()
        best: _Endpoint | None = None
        for endpoint in self._endpoints:
            if endpoint in tried or endpoint.down_until > now:
                continue
            if best is None or endpoint.in_flight < best.in_flight:
                best = endpoint
        if best is not None and len(self._endpoints) > 1:
            # Rotate so that equally loaded URLs take turns.
            self._endpoints.remove(best)
            self._endpoints.append(best)
        return best

    def _failed(self, endpoint: _Endpoint) -> None:
        endpoint.failures += 1
        if endpoint.failures >= _FAILURES_BEFORE_SET_ASIDE:
            backoff = self._backoff_s * 2 ** (endpoint.failures - _FAILURES_BEFORE_SET_ASIDE)
            endpoint.down_until = time.monotonic() + min(backoff, self._max_backoff_s)

    @staticmethod
    def _succeeded(endpoint: _Endpoint) -> None:
        endpoint.failures = 0
        endpoint.down_until = 0.0


def _describe(exc: httpx.TransportError) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _with_hint(status: int, message: str) -> str:
    if status == 501:
        return (
            f"{message} (this server does not serve decisions for its model: serve a Decision 3.0 model such as"
            " vllm-sr/d3-mini, or start vLLM with --logprobs-mode raw_logprobs for a generative model)"
        )
    if status == 404:
        return f"{message} (check the engine's model name in the configuration)"
    return message
