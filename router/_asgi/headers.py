"""Header hygiene: hop-by-hop headers (RFC 9110 7.6.1), values made safe, pairs encoded once."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

logger = logging.getLogger(__name__)


# RFC 9110 7.6.1 hop-by-hop headers, and those the proxy sets itself.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
     "trailers", "transfer-encoding", "upgrade"}
)  # fmt: skip
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
HOP_BY_HOP_RAW = frozenset(name.encode() for name in HOP_BY_HOP)
NOT_FORWARDED_RAW = frozenset(name.encode() for name in NOT_FORWARDED)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")

Headers = list[tuple[bytes, bytes]]


def header_value(value: str) -> bytes:
    """A header value that cannot break the response: no control characters, Latin-1 only."""
    return _UNSAFE.sub(" ", value).encode("latin-1", "replace")


def encode_headers(pairs: Iterable[tuple[str, str]]) -> Headers:
    """Each pair lower-cased and made safe (`header_value`). A pair is encoded once and then looked up: a route's
    `x-d3-*` headers repeat from one request to the next (a fifth of the headers' cost, measured)."""
    encoded = []
    for pair in pairs:
        found = _ENCODED.get(pair)
        if found is None:
            if len(_ENCODED) >= _ENCODED_MAX:  # values from requests (decision times, tags) must not grow it
                _ENCODED.clear()
            found = _ENCODED[pair] = (pair[0].lower().encode("latin-1"), header_value(pair[1]))
        encoded.append(found)
    return encoded


_ENCODED: dict[tuple[str, str], tuple[bytes, bytes]] = {}
_ENCODED_MAX = 4096


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of the header `name` (lower case, as ASGI gives names) in `headers`, or None. The one way
    the router reads a request header."""
    for key, value in headers:
        if key == name:
            return value
    return None


def header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """Every value of the header `name` in `headers`, in order (a header may be sent more than once)."""
    return [value for key, value in headers if key == name]


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The request's `content-length`, or 0 when it has none (chunked) or it is not a number."""
    value = header(headers, b"content-length")
    return int(value) if value is not None and value.isdigit() and len(value) < 19 else 0
