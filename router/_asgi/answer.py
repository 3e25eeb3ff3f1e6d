"""The answer names the model the client asked for (issue 26.1): a route that rewrote the request's `model` to the
upstream's writes the client's name back into the answer, a JSON body whole or a stream event by event.

    rename = Rename(api.answer_model, "auto")     # where the API's answer holds its model; the client's name
    body = rename.body(body)                      # a JSON answer
    out = rename.feed(chunk); ...; rename.flush() # an event stream, as it arrives

Only the bytes of the model's value change: the rest of the answer (thinking blocks and their signatures, tool
calls, ids) passes byte for byte, never parsed and written again. An event stream is cut at its event boundaries;
an event that arrives in pieces is held until it is whole (the one event, never the stream), and an event without
`"model"` in it passes as it came. Claude Code sends a turn's thinking block back with the next only when the
answer names the model it asked for, and Anthropic requires it back with a tool result.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence

from router._asgi.headers import Headers

ModelPaths = Sequence[tuple[str, ...]]  # e.g. (("model",), ("message", "model")): the keys leading to the model

# A JSON string (escapes included) or one structural character; numbers and literals are skipped between them.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]', re.DOTALL)
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_MODEL = b'"model"'


def model_span(data: bytes, paths: ModelPaths, start: int = 0) -> tuple[int, int] | None:
    """Where the string value at one of `paths` (keys through objects only) sits in the JSON text `data` from
    `start`: (start, end) of the value with its quotes, or None when no path leads to a string. The scan stops at
    the first found (an answer's model comes before its content)."""
    wanted = {tuple(key.encode() for key in path) for path in paths}
    keys: list[bytes | None] = []  # the key of each open object (None: an array, or before its first key)
    expect_key = False
    for match in _TOKENS.finditer(data, start):
        token = match.group()
        first = token[0]
        if first == 0x22:  # a string: a key, or a value
            if expect_key and keys:
                keys[-1] = token[1:-1]
                expect_key = False
            elif keys and keys[-1] is not None and tuple(keys) in wanted:
                return match.start(), match.end()
        elif first == 0x7B:  # {
            keys.append(None)
            expect_key = True
        elif first == 0x5B:  # [
            keys.append(None)
            expect_key = False
        elif first in (0x7D, 0x5D):  # } ]
            if keys:
                keys.pop()
            expect_key = False
        elif first == 0x2C:  # , : the next key, inside an object (an array's entries have None as their key)
            expect_key = bool(keys) and keys[-1] is not None
        # a ':' changes nothing: the value follows
    return None


class Rename:
    """Writes `model` (the client's name) where `paths` say the API's answer names its model; one per response."""

    def __init__(self, paths: ModelPaths, model: str) -> None:
        self.paths = paths
        self.model = json.dumps(model).encode()
        self._tail = b""

    def body(self, data: bytes) -> bytes:
        """A whole JSON answer with its model renamed (unchanged if it names none where expected)."""
        if _MODEL not in data:
            return data
        span = model_span(data, self.paths)
        if span is None:
            return data
        return data[: span[0]] + self.model + data[span[1] :]

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of `chunk` that can go on now: the whole events, renamed; a last event still incomplete is held
        (`flush` gives it back)."""
        data = self._tail + chunk if self._tail else chunk
        end = _last_boundary(data)
        if end < 0:
            self._tail = data
            return b""
        self._tail = data[end:]
        whole = data[:end]
        if _MODEL not in whole:
            return whole
        return b"".join(self._event(event) for event in _events(whole))

    def flush(self) -> bytes:
        """What is held: the stream's last, incomplete event, as it came."""
        tail, self._tail = self._tail, b""
        return tail

    def _event(self, event: bytes) -> bytes:
        if _MODEL not in event:
            return event
        at = event.find(b"data:")
        while at > 0 and event[at - 1] not in b"\r\n":  # `data:` must start a line
            at = event.find(b"data:", at + 1)
        if at < 0:
            return event
        line_end = len(event)
        for stop in (b"\r", b"\n"):
            found = event.find(stop, at)
            if 0 <= found < line_end:
                line_end = found
        span = model_span(event[:line_end], self.paths, at + 5)
        if span is None:
            return event
        return event[: span[0]] + self.model + event[span[1] :]


def _last_boundary(data: bytes) -> int:
    """The end of the last event boundary in `data` (a blank line), or -1."""
    ends = [at + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (at := data.rfind(sep)) >= 0]
    return max(ends, default=-1)


def _events(data: bytes) -> list[bytes]:
    """`data` (whole events) cut after each boundary; joined, the pieces are `data` again."""
    pieces, start = [], 0
    for match in _BOUNDARY.finditer(data):
        pieces.append(data[start : match.end()])
        start = match.end()
    if start < len(data):
        pieces.append(data[start:])
    return pieces


def decoded(body: bytes, headers: Headers) -> tuple[bytes, Headers] | None:
    """A gzip or deflate body decoded, its `content-encoding` dropped; None for any other encoding (the answer then
    passes as it came). A body without an encoding is returned as it is."""
    encodings = [v.strip().lower() for k, v in headers if k.lower() == b"content-encoding"]
    if not encodings or encodings == [b"identity"]:
        return body, headers
    if encodings not in ([b"gzip"], [b"deflate"]):
        return None
    try:
        wbits = 31 if encodings == [b"gzip"] else 15
        plain = zlib.decompress(body, wbits)
    except zlib.error:
        try:  # deflate as some servers send it: raw, without zlib's header
            plain = zlib.decompress(body, -15)
        except zlib.error:
            return None
    return plain, [(k, v) for k, v in headers if k.lower() != b"content-encoding"]


def resized(headers: Headers, size: int) -> Headers:
    """`headers` with `content-length` set to `size`."""
    return [(k, v) for k, v in headers if k.lower() != b"content-length"] + [(b"content-length", b"%d" % size)]


def renaming(paths: ModelPaths, asked: object, sent: str | None, setting: str) -> Rename | None:
    """The `Rename` for one upstream answer: when the request asked for the model `asked`, went upstream naming
    `sent` instead, and `server.answer_model` (`setting`) is `client`; else None (the answer passes as it came)."""
    if setting != "client" or sent is None or not isinstance(asked, str) or asked == sent:
        return None
    return Rename(paths, asked)
