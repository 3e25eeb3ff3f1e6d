"""Reading what an upstream answered, whatever its `Content-Encoding` (issue 26.4): the SDKs send
`Accept-Encoding: gzip`, so an upstream may compress the answer the router must read (a Responses answer's id). The
client still gets the bytes as they came; only the router's own reading is decoded.

    decoder = Decoder.for_encoding(response.headers.get("content-encoding", ""))
    text = decoder.feed(chunk)      # None once the encoding is unknown or the bytes are broken
    peek = FirstResponse(decoder)   # an event stream's `response.created` data, as soon as it has come
"""

from __future__ import annotations

import json
import zlib

from router._asgi.sse import EventReader, data_of

PEEK_LIMIT = 64 * 1024  # an event stream is read for its response id at most this far (decoded bytes)


class Decoder:
    """Incremental decoding of one body: identity, gzip (x-gzip) or deflate (zlib-wrapped or raw, as servers
    differ). Any other encoding, or bytes that do not decode, make `feed` answer None from then on."""

    def __init__(self, encoding: str) -> None:
        name = encoding.strip().lower()
        self.encoding = name
        self.failed = False
        self._zlib: zlib._Decompress | None = None
        if name in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self._zlib = None  # which of the two deflates is known from the first bytes
        elif name not in ("", "identity"):
            self.failed = True
        self._first = name == "deflate"

    def feed(self, chunk: bytes) -> bytes | None:
        if self.failed:
            return None
        if self._first:
            self._first = False
            wrapped = len(chunk) >= 2 and chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        if self._zlib is None:
            return chunk
        try:
            return self._zlib.decompress(chunk)
        except zlib.error:
            self.failed = True
            return None


def decoded(body: bytes, encoding: str) -> bytes | None:
    """A whole body decoded, or None when its encoding is unknown or the bytes broken."""
    decoder = Decoder(encoding)
    return decoder.feed(body)


class FirstResponse:
    """Watches an event stream's first events for one whose data carries the response (`response.created`): its
    data is given once, as soon as it is whole, so that a session learns the response's id before the stream ends."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.done = False
        self._reader = EventReader()
        self._seen = 0

    def feed(self, chunk: bytes) -> bytes | None:
        """The data of the first event carrying a response, once it is whole; None before and after."""
        if self.done:
            return None
        text = self.decoder.feed(chunk)
        if text is None:
            self.done = True
            return None
        self._seen += len(text)
        for event in self._reader.feed(text):
            data = data_of(event)
            if data is not None and _carries_response(data):
                self.done = True
                self._reader.close()
                return data
        if self._seen > PEEK_LIMIT:
            self.done = True
            self._reader.close()
        return None


def _carries_response(data: bytes) -> bool:
    if b'"response"' not in data:
        return False
    try:
        event = json.loads(data)
    except ValueError:
        return False
    return isinstance(event, dict) and isinstance(event.get("response"), dict)


READABLE = frozenset({b"gzip", b"x-gzip", b"deflate", b"identity"})


def readable_accept_encoding(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """For a request whose answer the router must read: the client's `Accept-Encoding` less the encodings `Decoder`
    cannot read (Codex asks for `zstd,gzip`, others for `br`), so that the upstream answers in one it can; [] when
    the client sent none (the upstream's default, identity, is readable)."""
    values = [value for name, value in headers if name == b"accept-encoding"]
    if not values:
        return []
    kept = [token.strip() for value in values for token in value.split(b",")
            if token.split(b";")[0].strip().lower() in READABLE]  # fmt: skip
    return [(b"accept-encoding", b", ".join(kept) or b"identity")]
