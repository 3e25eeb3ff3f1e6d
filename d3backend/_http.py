"""The one place that chooses how outbound HTTP is carried (engine calls here, upstream calls in `router`).

Everything speaks `httpx`; this module decides the transport under it, so that a faster transport (measured in
`benchmarks/`) is a change here and nowhere else. `TRANSPORT` is "aiohttp" (httpx's API on aiohttp's connection
pool, through `httpx-aiohttp`, when it is installed) or "httpx" (httpx's own pool).
"""

from __future__ import annotations

import importlib.util

import httpx

USER_AGENT = "d3-router"
TRANSPORT = "aiohttp" if importlib.util.find_spec("httpx_aiohttp") else "httpx"


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
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits, trust_env=False)
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        limits=limits,
        headers={"user-agent": USER_AGENT, **(headers or {})},
        transport=transport,
        follow_redirects=False,
        trust_env=False,  # never route engine or upstream traffic through an ambient proxy setting
    )
