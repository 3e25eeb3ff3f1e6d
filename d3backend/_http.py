"""The one place that chooses how outbound HTTP is carried (engine calls here, upstream calls in `router`).

Everything speaks `httpx`; this module decides the transport under it. The default is httpx's API on aiohttp's
connection pool (`httpx-aiohttp`): measured in `benchmarks/router.py`, httpx's own pool costs about twice the CPU
per request and slows down as concurrency rises (encode/httpcore#822, #1035). `TRANSPORT = "httpx"` switches
back, for comparison.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

USER_AGENT = "d3-router"
TRANSPORT = "aiohttp"


class _Transport(AiohttpTransport):
    """httpx-aiohttp with its errors mapped as httpx's own transport would raise them: a refused connection is a
    `ConnectError` and a dropped one a `RemoteProtocolError`, not a `ConnectTimeout`."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.TransportError as exc:
            raise _remap(exc, request) from exc.__cause__
        except (TimeoutError, aiohttp.ClientError) as exc:  # what the library leaves unmapped
            raise _remap(httpx.TransportError(str(exc)), request, exc) from exc


def _remap(exc: httpx.TransportError, request: httpx.Request, cause: BaseException | None = None) -> Exception:
    cause = cause or exc.__cause__
    message = str(cause or exc) or type(cause or exc).__name__
    kind: type[httpx.TransportError]
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(cause, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        kind = httpx.ReadTimeout
    elif isinstance(cause, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(cause, aiohttp.ServerDisconnectedError):
        kind = httpx.RemoteProtocolError
    elif isinstance(cause, aiohttp.ClientOSError):
        kind = httpx.ReadError
    else:
        return exc
    return kind(message, request=request)


def make_client(
    *,
    timeout: float,
    connect_timeout: float,
    max_connections: int = 256,
    base_url: str = "",
    headers: dict[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """A pooled client with separate connect and read timeouts; the caller closes it."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    if transport is None and TRANSPORT == "aiohttp":
        transport = _Transport(limits=limits, trust_env=False)
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        limits=limits,
        headers={"user-agent": USER_AGENT, **(headers or {})},
        transport=transport,
        follow_redirects=False,
        trust_env=False,  # never route engine or upstream traffic through an ambient proxy setting
    )
