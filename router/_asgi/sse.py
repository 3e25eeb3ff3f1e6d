"""The one reader of `text/event-stream` bytes (issue 27.5): where events end, incrementally, and what an event's data
says. Every part of the router that cuts a stream into events uses it: the answer guard's windows, the answer
renamed to the client's model, the session's peek at a streamed response's id, a stream read whole.

    reader = EventReader()
    for event in reader.feed(chunk):   # each whole event, as its bytes came, its blank line included
        text = data_of(event)          # its `data` lines joined, or None (a comment, a bare `event:` ...)
    rest = reader.close()              # an unfinished last event, as it came

Events end at a blank line, whatever the line ends (`\\n`, `\\r\\n` or `\\r`, even mixed: the WHATWG event-stream
grammar); an event is never re-encoded, so that the bytes given out, joined, are the bytes that came in. A `\\r` at
the very end of what has come is held until the next bytes say whether a `\\n` follows it (a `\\r\\n` cut in two).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# Two line ends in a row make a blank line; every such pair holds one of these (a `\r\n` alone holds none).
_PAIRS = (b"\n\n", b"\r\r", b"\n\r")
_CR, _LF = 13, 10


class EventTooLarge(Exception):
    """An event grew over the reader's limit before its end came."""


def _end(data: bytes, at: int) -> int:
    """The end of the blank line whose pair of line ends starts at `at` (a `\\r` then `\\n` is one line end)."""
    end = at + 2
    if data[end - 1] == _CR and end < len(data) and data[end] == _LF:
        end += 1
    return end


def _open(data: bytes, end: int) -> bool:
    """Whether a boundary ending at `end` may still grow (its last `\\r` is the last byte that came)."""
    return end == len(data) and data[end - 1] == _CR


def boundary_end(data: bytes, start: int = 0) -> int:
    """The end of the first event in `data` from `start` (after its blank line), or -1 when none ends there."""
    found = [at for pair in _PAIRS if (at := data.find(pair, start)) >= 0]
    return _end(data, min(found)) if found else -1


def last_boundary(data: bytes, final: bool = False) -> int:
    """The end of the last whole event in `data`, or -1; unless `final`, a boundary that a `\\n` still to come may
    extend does not count."""
    limit = len(data)
    while True:
        at = max(data.rfind(pair, 0, limit) for pair in _PAIRS)
        if at < 0:
            return -1
        end = _end(data, at)
        if final or not _open(data, end):
            return end
        limit = at + 1  # that pair's first line end may close an earlier blank line


def event_start(data: bytes, at: int) -> int:
    """Where the event holding the byte at `at` starts: after the last blank line before it (0 if none)."""
    before = max(data.rfind(pair, 0, at) for pair in _PAIRS)
    return 0 if before < 0 else min(_end(data, before), at)


def event_end(data: bytes, at: int) -> int:
    """Where the event holding the byte at `at` ends: after its blank line, or the end of `data`."""
    end = boundary_end(data, at)
    return len(data) if end < 0 else end


class EventReader:
    """Cuts a stream's chunks into its events, as they come; an unfinished event is held (up to `limit` bytes, then
    `EventTooLarge`)."""

    def __init__(self, limit: int | None = None, setting: str = "the reader's limit") -> None:
        self.limit = limit
        self.setting = setting  # named in the error: the setting that bounds the event
        self._held = b""

    @property
    def held(self) -> int:
        """How many bytes of an unfinished event are held."""
        return len(self._held)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events that `chunk` completes, each as its bytes came (its blank line included)."""
        scan = max(len(self._held) - 2, 0)  # a pair may start in what was held, never earlier (it would have ended)
        data = self._held + chunk if self._held else chunk
        found = [data.find(pair, scan) for pair in _PAIRS]
        events: list[bytes] = []
        at = 0
        while True:
            starts = [p for p in found if p >= 0]
            if not starts:
                break
            end = _end(data, min(starts))
            if _open(data, end):
                break
            events.append(data[at:end])
            at = end
            found = [data.find(pair, end) if 0 <= p < end else p for pair, p in zip(_PAIRS, found, strict=True)]
        self._held = data[at:] if at else data
        if self.limit is not None and len(self._held) > self.limit:
            raise EventTooLarge(f"a streamed event is larger than {self.setting} ({self.limit})")
        return events

    def whole(self, chunk: bytes) -> bytes:
        """The events that `chunk` completes as one byte string (b"" when none), cut at the last blank line only: the
        cheaper way when the events need not be told apart."""
        data = self._held + chunk if self._held else chunk
        end = last_boundary(data)
        if end < 0:
            self._held = data
            return b""
        self._held = data[end:]
        if self.limit is not None and len(self._held) > self.limit:
            raise EventTooLarge(f"a streamed event is larger than {self.setting} ({self.limit})")
        return data[:end] if self._held else data

    def close(self) -> bytes:
        """What is held (the stream's last event, unfinished or ending in a lone `\\r`), as it came; the reader is
        empty again."""
        held, self._held = self._held, b""
        return held


def events(raw: bytes) -> Iterator[bytes]:
    """The events of a whole stream, each as it came; a last one without its blank line too (when not blank)."""
    reader = EventReader()
    yield from reader.feed(raw)
    rest = reader.close()
    if rest.strip():
        yield rest


def data_of(event: bytes) -> bytes | None:
    """The event's data: its `data` fields in order, each less one leading space, joined by `\\n`; None when it has
    none (a comment `: ...`, an `event:`, `id:` or `retry:` alone). A field without a colon is a field with an
    empty value."""
    if b"data" not in event:
        return None
    if b"\r" in event:
        event = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    values: list[bytes] = []
    for line in event.split(b"\n"):
        if not line.startswith(b"data"):
            continue
        if len(line) == 4:
            values.append(b"")
        elif line[4] == 0x3A:  # `data:`
            values.append(line[6:] if line[5:6] == b" " else line[5:])
    return b"\n".join(values) if values else None


def json_data(event: bytes) -> dict[str, Any] | None:
    """The event's data as a JSON object, or None (no data, `[DONE]`, anything not a JSON object)."""
    text = data_of(event)
    if not text or text == b"[DONE]":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def ends_event(chunk: bytes) -> bool:
    """Whether `chunk` ends with a blank line (the end of an event)."""
    return last_boundary(chunk, final=True) == len(chunk)
