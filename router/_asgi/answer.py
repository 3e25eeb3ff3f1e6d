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

What it costs (benchmarks/README.md, "The answer's model renamed"): a JSON answer 6-11 us, a Messages stream
~25 us, a Responses stream ~60 us (three events carry the whole response), a chat chunk ~5 us: events are found by
`bytes.find`, never split, and an event whose data starts like the last renamed one's is renamed without a scan
(`test_an_event_unlike_the_last_is_scanned_anew` guards the shortcut).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from router._asgi import decoding
from router._asgi.headers import Headers
from router._asgi.sse import EventReader, event_end, event_start

ModelPaths = Sequence[tuple[str, ...]]  # e.g. (("model",), ("message", "model")): the keys leading to the model

# A JSON string (escapes included, the loop unrolled: a third faster), a key (a string and its colon), or a bracket;
# commas, colons after values, numbers and literals are skipped between them.
_TOKENS = re.compile(rb'("[^"\\]*(?:\\.[^"\\]*)*")(\s*:)?|[{}\[\]]')
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_MODEL = b'"model"'
_OPEN = frozenset(b"{[")

Wanted = frozenset[tuple[bytes, ...]]


def wanted(paths: ModelPaths) -> Wanted:
    return frozenset(tuple(key.encode() for key in path) for path in paths)


def model_span(data: bytes, paths: ModelPaths | Wanted, start: int = 0) -> tuple[int, int] | None:
    """Where the string value at one of `paths` (keys through objects only) sits in the JSON text `data` from
    `start`: (start, end) of the value with its quotes, or None when no path leads to a string. The scan stops at
    the first found (an answer's model comes before its content)."""
    targets = paths if isinstance(paths, frozenset) else wanted(paths)
    last = _LAST.get(targets) or _LAST.setdefault(targets, frozenset(path[-1] for path in targets))
    keys: list[bytes | None] = []  # the key of each open object (None: an array, or before its first key)
    for match in _TOKENS.finditer(data, start):
        kind = match.lastindex  # None: a bracket; 1: a value string; 2: a key
        if kind is None:
            if data[match.start()] in _OPEN:
                keys.append(None)
            elif keys:
                keys.pop()
        elif kind == 2:
            if keys:
                keys[-1] = match.group(1)[1:-1]
        elif keys and keys[-1] in last and tuple(keys) in targets:
            return match.span(1)
    return None


_LAST: dict[Wanted, frozenset[bytes]] = {}  # each set of paths' last keys (a handful: one per API)


class Rename:
    """Writes `model` (the client's name) where `paths` say the API's answer names its model; one per response."""

    def __init__(self, paths: ModelPaths, model: str) -> None:
        self.paths = wanted(paths)
        self.model = json.dumps(model).encode()
        self._events = EventReader()
        # The data line's bytes before the model's value in the last event renamed: a stream's chunks repeat them
        # (chat's id, object and created), so that the next such event is renamed without a scan.
        self._prefix = b""

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
        whole = self._events.whole(chunk)
        if not whole:
            return b""
        at = whole.find(_MODEL)
        if at < 0:
            return whole
        out: list[bytes] = []
        copied = 0
        while at >= 0:  # each event naming a model, found by bytes.find; the others are never cut out
            start, stop = event_start(whole, at), event_end(whole, at)
            event = whole[start:stop]
            renamed = self._event(event)
            if renamed is not event:
                out += (whole[copied:start], renamed)
                copied = stop
            at = whole.find(_MODEL, stop)
        if not out:
            return whole
        out.append(whole[copied:])
        return b"".join(out)

    def flush(self) -> bytes:
        """What is held: the stream's last, incomplete event, as it came."""
        return self._events.close()

    def _event(self, event: bytes) -> bytes:
        """`event` with its model renamed, or `event` itself."""
        at = event.find(b"data:")
        while at > 0 and event[at - 1] not in b"\r\n":  # `data:` must start a line
            at = event.find(b"data:", at + 1)
        if at < 0:
            return event
        at += 5
        span = None
        if self._prefix and event.startswith(self._prefix, at):
            value = _STRING.match(event, at + len(self._prefix))
            span = None if value is None else value.span()
        if span is None:
            line_end = len(event)
            for stop in (b"\r", b"\n"):
                found = event.find(stop, at)
                if 0 <= found < line_end:
                    line_end = found
            span = model_span(event[:line_end], self.paths, at)
            if span is None:
                return event
            self._prefix = event[at : span[0]]
        return event[: span[0]] + self.model + event[span[1] :]


class Watch:
    """Shows `see` each whole event of a stream that holds `marker` (its bytes, boundary included); the rest is not
    looked at. Read-only (`hold=False`), every chunk goes on as it came, at once: only a copy of the stream's last,
    incomplete event is kept to be read once whole. With `hold=True`, `see` also says whether the event goes on
    (False: it is cut out, as if the upstream had never sent it), and a last event still incomplete is held until it
    is whole (`flush` gives it back), as `Rename` holds one. One per response; events are cut by the one reader
    (router/_asgi/sse.py)."""

    def __init__(self, marker: bytes, see: Callable[[bytes], bool], *, hold: bool = False) -> None:
        self.marker, self.see, self.hold = marker, see, hold
        self._events = EventReader()

    def feed(self, chunk: bytes) -> bytes:
        """What of `chunk` goes on now: all of it (read-only), or its whole events less those `see` drops."""
        whole = self._events.whole(chunk)
        at = whole.find(self.marker) if whole else -1
        if at < 0:
            return whole if self.hold else chunk
        out: list[bytes] = []
        copied = 0
        while at >= 0:
            start, stop = event_start(whole, at), event_end(whole, at)
            if not self.see(whole[start:stop]) and self.hold:
                out += (whole[copied:start],)
                copied = stop
            at = whole.find(self.marker, stop)
        if not self.hold:
            return chunk
        out.append(whole[copied:])
        return b"".join(out)

    def flush(self) -> bytes:
        """The stream ended: its last event without a boundary is read too; held, it is given back (unless dropped)."""
        tail = self._events.close()
        if tail and self.marker in tail and not self.see(tail) and self.hold:
            return b""
        return tail if self.hold else b""


def decoded(body: bytes, headers: Headers) -> tuple[bytes, Headers] | None:
    """A gzip or deflate body decoded (router/_asgi/decoding.py), its `content-encoding` dropped; None for any other
    encoding or broken bytes (the answer then passes as it came). A body without an encoding is returned as it is."""
    encodings = b", ".join(v.strip().lower() for k, v in headers if k.lower() == b"content-encoding")
    if encodings in (b"", b"identity"):
        return body, headers
    plain = decoding.decoded(body, encodings.decode("latin-1"))
    if plain is None:
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
