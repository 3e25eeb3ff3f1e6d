"""The one place that chooses how outbound HTTP is carried (engine calls here, upstream calls in `router`).

Everything speaks `httpx`; this module decides the transport and pool under it, so that a faster transport
(measured in `benchmarks/`) is a change here and nowhere else.
"""

from __future__ import annotations

import httpx

USER_AGENT = "d3-router"


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
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        headers={"user-agent": USER_AGENT, **(headers or {})},
        transport=transport,
        follow_redirects=False,
        trust_env=False,  # never route engine or upstream traffic through an ambient proxy setting
    )
