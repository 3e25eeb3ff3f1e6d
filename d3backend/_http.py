"""The one place that chooses how outbound HTTP is carried (engine calls here, upstream calls in `router`).

Everything speaks `httpx`; this module decides the transport under it. The default carries httpx's requests on
aiohttp's connection pool: measured in `benchmarks/router.py`, httpx's own pool costs about twice the CPU per
request and slows down as concurrency rises (encode/httpcore#822, #1035). `TRANSPORT = "httpx"` switches back,
for comparison.

Ours, not httpx-aiohttp's (the library transport the openai SDK offers), measured (issue 17, benchmarks/results/
router-issue17.md, 2 shared cores): the same CPU per request within noise, d3router cache hit 0.57/0.31/0.31 ms
(ours) vs 0.55/0.31/0.32 ms at c=1/8/64, streamed 0.58/0.31/0.32 vs 0.60/0.30/0.33. Kept for behaviour: even on a
session set up as ours, httpx-aiohttp 0.2.0 raises ConnectTimeout for a refused connection and for a server that
hangs up (httpx: ConnectError, RemoteProtocolError) and sends repeated headers joined into one
(tests/d3backend/test_http.py runs on both, its failures there as strict xfails); its default session keeps
cookies and adds headers; and it has no pool wait of its own (below). Wrapping it to fix those is this module.

Each transport holds at most `max_connections` requests in flight; one more waits `pool_timeout_s` and gets
`httpx.PoolTimeout` (one transport per upstream keeps a hung upstream from starving the others).

The transport keeps no cookies (a proxy must not hand one user's cookies to the next), adds no headers and
decodes nothing: the bytes go and come back as they are. Its errors are the ones httpx's own transport raises.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import cast

import aiohttp
import httpx

USER_AGENT = "d3-router"
TRANSPORT = "aiohttp"


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx requests on an aiohttp session, created on first use (aiohttp binds it to the running loop).

    At most `max_connections` requests are in flight at once, each holding its slot until its response is closed.
    A request that finds none free waits `pool_timeout_s` (or, without it, the request's own `pool` timeout) and
    then fails with `httpx.PoolTimeout`: a short wait of its own, not the upstream's read timeout."""

    def __init__(self, max_connections: int = 256, keepalive_s: float = 5.0, pool_timeout_s: float | None = None):
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._pool_timeout_s = pool_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(max_connections)

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive_s)
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            auto_decompress=False,
            trust_env=False,
        )
        return self._session

    async def _wait_for_slot(self, request: httpx.Request, timeout: dict[str, float | None]) -> None:
        wait_s = self._pool_timeout_s if self._pool_timeout_s is not None else timeout.get("pool")
        try:
            async with asyncio.timeout(wait_s):
                await self._slots.acquire()
        except TimeoutError:
            message = f"no free connection within {wait_s:g} s (all {self._max_connections} in use)"
            raise httpx.PoolTimeout(message, request=request) from None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session or self._open()
        timeout = request.extensions.get("timeout", {})
        if self._slots.locked():
            await self._wait_for_slot(request, timeout)
        else:
            await self._slots.acquire()  # free: returns at once
        try:
            response = await self._send(session, request, timeout)
        except BaseException:
            self._slots.release()
            raise
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response, request, self._slots),
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode()},
        )

    async def _send(
        self, session: aiohttp.ClientSession, request: httpx.Request, timeout: dict[str, float | None]
    ) -> aiohttp.ClientResponse:
        headers = request.headers.multi_items()
        data: bytes | httpx.AsyncByteStream | None
        try:
            data = request.content or None
        except httpx.RequestNotRead:  # a streamed body: aiohttp sends it chunked itself
            data = request.stream  # type: ignore[assignment]
            headers = [(name, value) for name, value in headers if name.lower() != "transfer-encoding"]
        try:
            return await session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=_client_timeout(timeout.get("connect"), timeout.get("read")),
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _httpx_error(exc, request) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


@functools.lru_cache(maxsize=64)
def _client_timeout(connect_s: float | None, read_s: float | None) -> aiohttp.ClientTimeout:
    """The connect timeout bounds the whole connection set-up (name resolution too); waiting for a free slot is
    the transport's own, before aiohttp is asked."""
    return aiohttp.ClientTimeout(sock_connect=connect_s, sock_read=read_s, connect=connect_s)


class _Body(httpx.AsyncByteStream):
    """A response body as it arrives, in the pieces the socket delivers (never held back to fill a buffer)."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request, slots: asyncio.Semaphore) -> None:
        self._response = response
        self._request = request
        self._slots: asyncio.Semaphore | None = slots

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        self._response.release()
        if self._slots is not None:  # once, however often it is closed
            self._slots.release()
            self._slots = None


def _httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    message = str(exc) or type(exc).__name__
    kind: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        kind = httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        kind = httpx.RemoteProtocolError
    elif isinstance(exc, aiohttp.InvalidURL):
        kind = httpx.UnsupportedProtocol
    elif isinstance(exc, aiohttp.ClientOSError):
        kind = httpx.ReadError
    else:
        kind = httpx.TransportError
    return kind(message, request=request)


def outbound_request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | Sequence[tuple[bytes, bytes]],
    content: bytes | None,
    timeout_s: float,
    connect_timeout_s: float,
    query: bytes = b"",
) -> httpx.Request:
    """A request to hand to a transport directly. The URL and the timeouts are built once per distinct value, in
    bounded caches: httpx's URL parsing is a visible share of a proxied request, and pass-through paths come from
    clients, so an unbounded cache would grow with whatever paths they send."""
    parsed = _url(url)
    if query:
        parsed = parsed.copy_with(query=query)
    extensions = {"timeout": _timeout(timeout_s, connect_timeout_s)}
    pairs: list[tuple[str | bytes, str | bytes]] = list(headers.items() if isinstance(headers, Mapping) else headers)
    names = {(name if isinstance(name, bytes) else name.encode("latin-1")).lower() for name, _ in pairs}
    if names & _SET_BY_HTTPX:  # the caller set them: httpx's own rules apply as they are
        return httpx.Request(method, parsed, headers=headers, content=content, extensions=extensions)
    # httpx's defaults for `content=`, set here directly: Host first, Content-Length last, as httpx orders them.
    # Its own way (setdefault on its Headers) was a tenth of the router's own time per proxied request.
    body = content or b""
    if body or method in ("POST", "PUT", "PATCH"):
        pairs.append((b"Content-Length", str(len(body)).encode()))
    if parsed.host:
        pairs.insert(0, (b"Host", parsed.netloc))
    given = cast(Sequence[tuple[bytes, bytes]], pairs)  # str and bytes pairs alike: httpx encodes each
    request = httpx.Request(method, parsed, headers=given, stream=httpx.ByteStream(body), extensions=extensions)
    request.read()  # `request.content` is the body, as after `content=`
    return request


_SET_BY_HTTPX = frozenset({b"host", b"content-length", b"transfer-encoding"})


@functools.lru_cache(maxsize=1024)
def _url(text: str) -> httpx.URL:
    return httpx.URL(text)


@functools.lru_cache(maxsize=64)
def _timeout(timeout_s: float, connect_timeout_s: float) -> dict[str, float | None]:
    return httpx.Timeout(timeout_s, connect=connect_timeout_s).as_dict()


def make_transport(max_connections: int = 256, pool_timeout_s: float | None = None) -> httpx.AsyncBaseTransport:
    """The outbound transport, pooled (`TRANSPORT` picks which; the caller closes it): at most `max_connections`
    requests in flight; one more waits `pool_timeout_s` for a free connection (default: the request's `pool`
    timeout), then raises `httpx.PoolTimeout`."""
    if TRANSPORT == "aiohttp":
        return AiohttpTransport(max_connections, pool_timeout_s=pool_timeout_s)
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    if TRANSPORT == "httpx-aiohttp":  # measured against ours in benchmarks/router.py, not used
        return _library_aiohttp(limits)
    return _PoolTimeout(httpx.AsyncHTTPTransport(limits=limits, trust_env=False), pool_timeout_s)


class _PoolTimeout(httpx.AsyncBaseTransport):
    """httpx's own transport with the transport's pool timeout in place of the request's."""

    def __init__(self, inner: httpx.AsyncBaseTransport, pool_timeout_s: float | None) -> None:
        self._inner = inner
        self._pool_timeout_s = pool_timeout_s

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._pool_timeout_s is not None:
            timeout = {**request.extensions.get("timeout", {}), "pool": self._pool_timeout_s}
            request.extensions = {**request.extensions, "timeout": timeout}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _library_aiohttp(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    """httpx-aiohttp's transport, on a session set up as ours (no cookies kept, no headers added, nothing decoded)."""
    from httpx_aiohttp import AiohttpTransport as LibraryTransport  # type: ignore[import-not-found,unused-ignore]

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limits.max_connections or 0, keepalive_timeout=5.0),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            auto_decompress=False,
            trust_env=False,
        )

    transport: httpx.AsyncBaseTransport = LibraryTransport(limits=limits, trust_env=False, client=session)
    return transport


def make_client(
    *,
    timeout: float,
    connect_timeout: float,
    max_connections: int = 256,
    base_url: str = "",
    headers: dict[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """A pooled client with separate connect and read timeouts and no cookie jar; the caller closes it."""
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        headers={"user-agent": USER_AGENT, **(headers or {})},
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),  # keeps nothing a server sets
        transport=transport or make_transport(max_connections),
        follow_redirects=False,
        trust_env=False,  # never route engine or upstream traffic through an ambient proxy setting
    )
