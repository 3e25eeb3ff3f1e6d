"""Sending a request upstream: one connection pool per upstream, the headers that may go, the key by API, and
the pass-through path checks.

    forwarder = Forwarder(environ, metrics)                 # or Forwarder(..., transport=mock) in tests
    response, failure = await forwarder.open(api, upstream, "small", "POST", "/chat/completions", scope, body, tags)
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from urllib.parse import unquote_to_bytes

import httpx
from starlette.types import Scope

from d3backend import make_transport, outbound_request
from policies import Config, UpstreamSettings
from router._apis.chat import Api
from router._asgi.headers import NOT_FORWARDED_RAW, Headers, header_values
from router._observe import logs, tracing
from router._observe.metrics import Metrics

logger = logging.getLogger(__name__)

_KEY_HEADERS = (b"authorization", b"x-api-key")


Failure = tuple[int, str]  # why no response came: the status to answer (502, 503 or 504), and a message


class Forwarder:
    """Opens upstream requests. Each upstream has its own pool (`max_connections`), so one that hangs cannot take
    the connections another needs; an injected transport (tests) serves every upstream and is not closed."""

    def __init__(self, environ: Mapping[str, str], metrics: Metrics, transport: httpx.AsyncBaseTransport | None):
        self.environ = environ
        self.metrics = metrics
        self._shared = transport
        self._pools: dict[tuple[str, str, int, float], httpx.AsyncBaseTransport] = {}
        self._retired: dict[tuple[str, str, int, float], httpx.AsyncBaseTransport] = {}

    def transport(self, name: str, upstream: UpstreamSettings) -> httpx.AsyncBaseTransport:
        if self._shared is not None:
            return self._shared
        key = _key(name, upstream)
        pool = self._pools.get(key) or self._retired.get(key)  # retired: a request under the old configuration
        if pool is None:  # a reload that changes the upstream gets a new pool; the old one is retired
            pool = self._pools[key] = make_transport(upstream.max_connections, upstream.pool_timeout_s)
        return pool

    def retire(self, config: Config) -> list[httpx.AsyncBaseTransport]:
        """Take out the pools `config` no longer uses; requests still under the old configuration keep them until
        `close_retired`, called once they ended."""
        keep = {_key(name, upstream) for name, upstream in config.upstreams.items()}
        gone = {key: pool for key, pool in self._pools.items() if key not in keep}
        for key in gone:
            del self._pools[key]
        self._retired.update(gone)
        return list(gone.values())

    async def close_retired(self, pools: list[httpx.AsyncBaseTransport]) -> None:
        self._retired = {key: pool for key, pool in self._retired.items() if pool not in pools}
        for pool in pools:
            await pool.aclose()

    async def aclose(self) -> None:
        pools = [*self._pools.values(), *self._retired.values()]
        self._pools, self._retired = {}, {}
        for pool in pools:
            await pool.aclose()

    def headers(self, scope: Scope, api: Api, upstream: UpstreamSettings, tags: Headers) -> Headers:
        """The client's headers less hop-by-hop ones, those its `Connection` header names (RFC 9110 7.6.1), any
        `x-d3-*` (only the router tags its decisions) and those a tag replaces; never the client's credentials
        (unless `upstreams.NAME.forward_client_key`), the upstream's key, if it has one, in the API's header instead;
        the proxy's request id as `x-request-id`."""
        drop = {name for name, _ in tags}
        request_id = logs.request_id()
        if request_id is not None:
            drop.add(b"x-request-id")
            tags = [*tags, (b"x-request-id", request_id.encode("latin-1"))]
        for value in header_values(scope["headers"], b"connection"):
            drop.update(token.strip().lower() for token in value.split(b","))
        key = None
        if not upstream.forward_client_key:  # the caller's credential never leaves the router (issue 25.1)
            drop.update(_KEY_HEADERS)
        if upstream.api_key_env:
            key = self.environ.get(upstream.api_key_env, "")
        headers = [(k, v) for k, v in scope["headers"]
                   if k not in NOT_FORWARDED_RAW and k not in drop and not k.startswith(b"x-d3-")]  # fmt: skip
        if key is not None:
            headers += api.key_headers(key)
        return headers + tags

    async def open(
        self, api: Api, upstream: UpstreamSettings, name: str, method: str, path: str, scope: Scope, payload: bytes,
        tags: Headers,
    ) -> tuple[httpx.Response | None, Failure]:  # fmt: skip
        """Send the request and wait for the response's headers; a failure is (None, (status, message))."""
        request = outbound_request(
            method, upstream.url + path, headers=tracing.propagate_headers(self.headers(scope, api, upstream, tags)),
            content=payload,
            timeout_s=upstream.timeout_s, connect_timeout_s=upstream.connect_timeout_s,
            query=scope.get("query_string", b""),
        )  # fmt: skip
        start = time.perf_counter()
        try:
            response = await self.transport(name, upstream).handle_async_request(request)
        except httpx.PoolTimeout:
            self.metrics.upstream_errors[(name, "pool")] += 1
            return None, (503, f"upstream {name!r} has no free connection (upstreams.{name}.max_connections)")
        except httpx.TimeoutException:
            self.metrics.upstream_errors[(name, "timeout")] += 1
            return None, (504, f"upstream {name!r} did not answer within {upstream.timeout_s:g} s")
        except httpx.TransportError as exc:
            self.metrics.upstream_errors[(name, "connect")] += 1
            return None, (502, f"cannot reach upstream {name!r}: {type(exc).__name__}")
        self.metrics.upstream_seconds[name].observe(time.perf_counter() - start)
        return response, (response.status_code, "")


def _key(name: str, upstream: UpstreamSettings) -> tuple[str, str, int, float]:
    return (name, upstream.url, upstream.max_connections, upstream.pool_timeout_s)


def unsafe_path(raw_path: bytes) -> str | None:
    """Why a pass-through path may not be forwarded, or None. Checked on the percent-decoded path, as an upstream
    would read it: no `.` or `..` segment, no encoded slash or backslash, no control character."""
    lowered = raw_path.lower()
    if b"%2f" in lowered or b"%5c" in lowered or b"\\" in raw_path:
        return "an encoded slash or a backslash"
    decoded = unquote_to_bytes(raw_path)
    if any(byte < 0x20 or byte == 0x7F for byte in decoded):
        return "a control character"
    if any(segment in (b".", b"..") for segment in decoded.split(b"/")):
        return "a '.' or '..' segment"
    return None


def allowed(path: str, patterns: list[str]) -> bool:
    """Whether `server.passthrough` lists `path` (a pattern ending in `*` matches what starts with the rest)."""
    return any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in patterns)


_SLASHES = re.compile(rb"/{2,}")


def decided_path(raw_path: bytes, endpoints: tuple[str, ...]) -> str | None:
    """The router's own endpoint `raw_path` names however it is spelled (percent-encoded, in another case, with
    `//`, a trailing `/` or `;parameters`, as an upstream's router may read it), or None. Such a path is never
    passed through, whatever `server.passthrough` says (issue 25.2)."""
    path = unquote_to_bytes(raw_path).lower()
    path = b"/".join(segment.split(b";")[0] for segment in _SLASHES.sub(b"/", path).split(b"/"))
    path = path.rstrip(b"/") or b"/"
    for endpoint in sorted(endpoints, key=len, reverse=True):  # the most specific: /v1/messages/count_tokens first
        if path == endpoint.encode() or path.startswith(endpoint.encode() + b"/"):
            return endpoint
    return None
