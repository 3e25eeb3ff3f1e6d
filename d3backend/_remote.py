"""`RemoteEngine`: one or more vLLM servers answering `/v1/systemone` over HTTP.

    async with RemoteEngine(["http://d3-a:8000", "http://d3-b:8000"], model="vllm-sr/d3-mini") as engine:
        decided = await engine.decide("Fix my Rust borrow error", {"kind": Choice(None, {"code": None, "chat": None})})
        decided.answers["kind"].choice

Calls go to the healthy URL with the fewest requests in flight (equally loaded URLs take turns). A connection
error, a timeout, a 5xx or a 429 is retried once on another URL. Each try must answer within `timeout_s`, whatever
the transport. A URL that fails twice in a row is ejected: no live request goes to it until a background probe, one
small decision to that URL (`probe()`'s), succeeds, and a success returns it at once. The first probe comes after
`backoff_s`; each failed probe doubles the wait, up to `max_backoff_s` (1 s to 30 s by default). The probe is a
decision rather than vLLM's `GET /health` because it proves what live calls need: the model is served, the key is
taken, and whatever stands in front of the engine routes `/v1/systemone` (issue 14.5). The probing task starts on
the running loop at the first ejection, ends when no URL is ejected, and `aclose()` cancels it.

`pool_stats()` shows each URL's state and counters (for `/metrics`); URLs there, in errors and in logs carry no
user name or password.

`ENGINE_HEADERS`, a context variable, adds headers to the engine requests made in its context: the router puts the
W3C `traceparent` of its engine span there (router/_observe/tracing.py), so d3backend needs no tracing library.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
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

logger = logging.getLogger(__name__)


def redact_url(url: str) -> str:
    """`url` without the user name and password it may carry, for logs, errors and metric labels.

    >>> redact_url("http://user:secret@d3-a:8000")
    'http://d3-a:8000'
    """
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


@dataclass(frozen=True, slots=True)
class UrlStats:
    """One engine URL as `RemoteEngine.pool_stats()` shows it. `url` has no credentials; `ejected_until` is when
    the next probe is due, on the `time.monotonic()` clock (None while the URL is in rotation). The counters count
    from the engine's start: `requests` live tries sent, `failures` those that failed (connection, timeout, 5xx,
    429), `ejections` times the URL was taken out of rotation, `probes` and `probe_failures` the background checks."""

    url: str
    in_flight: int
    healthy: bool
    ejected_until: float | None
    requests: int
    failures: int
    ejections: int
    probes: int
    probe_failures: int


@dataclass(slots=True)
class _Endpoint:
    url: str
    label: str  # the URL without credentials
    in_flight: int = 0
    failures: int = 0  # consecutive live failures
    ejected: bool = False
    probe_at: float = 0.0  # when the next probe of an ejected URL is due (time.monotonic())
    failed_probes: int = 0  # consecutive, since the ejection
    requests: int = 0
    errors: int = 0
    ejections: int = 0
    probes: int = 0
    probe_errors: int = 0

    def stats(self) -> UrlStats:
        return UrlStats(
            self.label, self.in_flight, not self.ejected, self.probe_at if self.ejected else None, self.requests,
            self.errors, self.ejections, self.probes, self.probe_errors,
        )  # fmt: skip


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
        self._configured = tuple(_Endpoint(url.rstrip("/"), redact_url(url.rstrip("/"))) for url in urls)
        self._endpoints = list(self._configured)  # reordered as calls rotate
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
        self._prober: asyncio.Task[None] | None = None
        self._prober_wake: asyncio.Event | None = None
        self._closed = False

    @property
    def model(self) -> str | None:
        """The served model name, once configured or discovered."""
        return self._model

    @property
    def urls(self) -> tuple[str, ...]:
        """The configured URLs, in their order (credentials included: not for logs)."""
        return tuple(endpoint.url for endpoint in self._configured)

    def pool_stats(self) -> tuple[UrlStats, ...]:
        """Each URL's state and counters, in the configured order; read-only, cheap enough for every scrape.

        >>> [(url.url, url.healthy, url.in_flight) for url in engine.pool_stats()]
        [('http://d3-a:8000', True, 3), ('http://d3-b:8000', False, 0)]
        """
        return tuple(endpoint.stats() for endpoint in self._configured)

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
        prober, self._prober = self._prober, None
        if prober is not None and not prober.done():
            prober.cancel()
            if prober.get_loop() is asyncio.get_running_loop():
                await asyncio.wait([prober])  # not `await prober`: that would raise its cancellation here
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
            endpoint.requests += 1
            try:
                # The deadline is enforced here, not only through httpx's timeouts: a transport may ignore those
                # (httpx.ASGITransport, the embedded engine's, does), and a hung call would pin the cache's
                # single-flight entry for its key (issue 19.8). Cancelling the send cancels the transport's work.
                async with asyncio.timeout(self._timeout_s):
                    status, body = await self._send(method, endpoint.url, path, content)
            except (httpx.TimeoutException, TimeoutError):
                error = EngineTimeout(f"the engine at {endpoint.label} did not answer within {self._timeout_s:g} s")
                self._failed(endpoint)
                continue
            except httpx.TransportError as exc:
                error = EngineUnavailable(f"cannot reach the engine at {endpoint.label}: {_describe(exc)}")
                self._failed(endpoint)
                continue
            finally:
                endpoint.in_flight -= 1
            if status == 200:
                self._succeeded(endpoint)
                return body
            message = error_message(status, body)
            if status == 429 or (status >= 500 and status != 501):
                error = EngineUnavailable(f"the engine at {endpoint.label} answered {status}: {message}")
                self._failed(endpoint)
                continue
            self._succeeded(endpoint)  # it is up; the request is what it refused
            raise EngineRejected(status, _with_hint(status, message))
        if error is None:
            wait = min(endpoint.probe_at for endpoint in self._endpoints) - time.monotonic()
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
        best: _Endpoint | None = None
        ejected = False
        for endpoint in self._endpoints:
            if endpoint.ejected:
                ejected = True
                continue
            if endpoint in tried:
                continue
            if best is None or endpoint.in_flight < best.in_flight:
                best = endpoint
        if best is not None and len(self._endpoints) > 1:
            # Rotate so that equally loaded URLs take turns.
            self._endpoints.remove(best)
            self._endpoints.append(best)
        if ejected and (self._prober is None or self._prober.done()):
            self._start_prober()  # the task ended on an error it did not expect: a URL must never stay out for good
        return best

    def _failed(self, endpoint: _Endpoint) -> None:
        endpoint.errors += 1
        if endpoint.ejected:
            return  # calls sent before the ejection, failing now: the probes' backoff is theirs alone
        endpoint.failures += 1
        if endpoint.failures >= _FAILURES_BEFORE_SET_ASIDE:
            endpoint.ejected = True
            endpoint.ejections += 1
            endpoint.failed_probes = 0
            endpoint.probe_at = time.monotonic() + self._backoff_s
            logger.warning(
                "the engine at %s failed %d times in a row; it is set aside and probed in %g s",
                endpoint.label, endpoint.failures, self._backoff_s,
            )  # fmt: skip
            self._start_prober()

    @staticmethod
    def _succeeded(endpoint: _Endpoint) -> None:
        endpoint.failures = 0
        if endpoint.ejected:
            endpoint.ejected = False
            logger.info("the engine at %s answers again; it is back in rotation", endpoint.label)

    # --- probes of ejected URLs ----------------------------------------------------------------------------------
    def _start_prober(self) -> None:
        """Start the probing task on the running loop unless it runs (then wake it: a new ejection may be due
        before the one it sleeps for)."""
        if self._closed:
            return
        if self._prober is None or self._prober.done():
            if self._prober is not None and not self._prober.cancelled() and self._prober.exception() is not None:
                logger.error("probing the ejected engine URLs failed", exc_info=self._prober.exception())
            self._prober_wake = asyncio.Event()
            self._prober = asyncio.get_running_loop().create_task(self._probe_ejected(self._prober_wake))
        elif self._prober_wake is not None:
            self._prober_wake.set()

    async def _probe_ejected(self, wake: asyncio.Event) -> None:
        """Probe each ejected URL when due, until none is ejected."""
        while True:
            ejected = [endpoint for endpoint in self._configured if endpoint.ejected]
            if not ejected:
                return
            now = time.monotonic()
            due = [endpoint for endpoint in ejected if endpoint.probe_at <= now]
            if due:
                await asyncio.gather(*(self._probe(endpoint) for endpoint in due))
                continue
            wake.clear()
            try:
                async with asyncio.timeout(min(endpoint.probe_at for endpoint in ejected) - now):
                    await wake.wait()
            except TimeoutError:
                pass

    async def _probe(self, endpoint: _Endpoint) -> None:
        endpoint.probes += 1
        status: int | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._model is None:  # no decision can be asked yet; the model list proves the server is up
                    status, _ = await self._send("GET", endpoint.url, "/v1/models", None)
                else:
                    body = request_body(self._model, "d3-router readiness check", _PROBE_QUESTIONS, (), ())
                    status, _ = await self._send("POST", endpoint.url, "/v1/systemone", body)
        except (httpx.TransportError, TimeoutError):
            pass
        if not endpoint.ejected:
            return  # a live call that was in flight brought it back meanwhile
        if status == 200:
            self._succeeded(endpoint)
            return
        endpoint.probe_errors += 1
        endpoint.failed_probes += 1
        backoff = min(self._backoff_s * 2**endpoint.failed_probes, self._max_backoff_s)
        endpoint.probe_at = time.monotonic() + backoff


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
