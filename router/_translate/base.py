"""The translation framework: what a translation between two APIs offers, and reading an event stream's bytes.

    tr = translation("messages", "chat")                  # None: no translation between them (or the same API)
    body, lost = tr.request(client_body)                  # the upstream's body; the names of what could not go
    answer, lost = tr.answer(upstream_answer)             # a whole JSON answer back in the client's API
    stream = tr.stream()
    out = stream.feed(chunk)                              # client-API SSE bytes, as soon as an event is whole
    out += stream.flush()                                 # at the stream's end; stream.losses names what was lost
    tr.error(429, upstream_error_body)                    # the upstream's error in the client's shape

A translation turns a request of the `client` API into one of the `upstream` API, and the upstream's answers back.
What the upstream API cannot hold is never dropped silently: each loss is named (a short snake_case name, e.g.
`thinking_signature_dropped`) in the lists returned, the proxy writes them in `x-d3-translation-losses` and counts
them (docs/translation.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from policies import ApiName
from router._asgi.sse import EventReader

Body = dict[str, Any]
# The signature of a thinking block the router made from another API's reasoning: no model made it, so the router
# never sends such a block on, whatever the route (router/_faces/translated.py `unsigned`).
UNSIGNED = "d3router-unsigned"


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: its `event:` name (None when it has none) and its `data:` lines joined."""

    event: str | None
    data: str

    def json(self) -> Any:
        """The data parsed as JSON; None for data that is not (`[DONE]`, a keep-alive)."""
        try:
            return json.loads(self.data)
        except ValueError:
            return None


def sse(data: Any, event: str | None = None) -> bytes:
    """One event's bytes: `event: NAME` (when given) and the data as compact JSON (a str as it is)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + text.encode() + b"\n\n"


class SseReader:
    """Cuts an event stream's bytes into events as they come, with the router's one event-stream reader
    (router/_asgi/sse.py): an event that arrives in pieces is held until its blank line (that one event, never the
    stream)."""

    def __init__(self) -> None:
        self._reader = EventReader()

    def feed(self, chunk: bytes) -> Iterator[SseEvent]:
        for block in self._reader.feed(chunk):
            event = _parse(block)
            if event is not None:
                yield event

    def flush(self) -> Iterator[SseEvent]:
        """An event left without its closing blank line when the stream ended."""
        tail = self._reader.close()
        event = _parse(tail) if tail.strip() else None
        if event is not None:
            yield event


def _parse(block: bytes) -> SseEvent | None:
    name: str | None = None
    lines: list[str] = []
    for line in block.replace(b"\r\n", b"\n").replace(b"\r", b"\n").decode("utf-8", "replace").split("\n"):
        if not line or line.startswith(":"):
            continue  # a comment (a keep-alive)
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            lines.append(value)
    return SseEvent(name, "\n".join(lines)) if lines or name else None


class StreamTranslator(Protocol):
    """One streamed answer, translated event by event: `feed` returns the client-API bytes of the events the chunk
    completed (never holding the stream back), `flush` those its end brings (closing events), `error` the client
    API's mid-stream error event; `losses` names what the stream could not carry."""

    @property
    def losses(self) -> list[str]: ...

    def feed(self, chunk: bytes | SseEvent) -> bytes: ...

    def flush(self) -> bytes: ...

    def error(self, message: str) -> bytes: ...


class Translation(Protocol):
    """A request of the `client` API carried by an upstream of the `upstream` API, and its answers back."""

    client: ApiName
    upstream: ApiName
    upstream_path: str  # the upstream API's path under the upstream's url, e.g. "/chat/completions"

    def request(self, body: Body) -> tuple[Body, list[str]]: ...

    def answer(self, body: Body) -> tuple[Body, list[str]]: ...

    def stream(self) -> StreamTranslator: ...

    def error(self, status: int, body: bytes) -> bytes: ...


class EventTranslator:
    """A base for stream translators: cuts the bytes into events (`SseReader`) and hands each to `event`, which
    returns the client-API bytes it makes; `end` makes what the stream's end brings."""

    def __init__(self) -> None:
        self.losses: list[str] = []
        self._reader = SseReader()

    def feed(self, chunk: bytes | SseEvent) -> bytes:
        if isinstance(chunk, SseEvent):
            return self.event(chunk)
        return b"".join(self.event(event) for event in self._reader.feed(chunk))

    def flush(self) -> bytes:
        out = b"".join(self.event(event) for event in self._reader.flush())
        return out + self.end()

    def lose(self, name: str) -> None:
        if name not in self.losses:
            self.losses.append(name)

    def event(self, event: SseEvent) -> bytes:  # pragma: no cover - each translator has its own
        raise NotImplementedError

    def end(self) -> bytes:
        return b""

    def error(self, message: str) -> bytes:  # pragma: no cover - each translator has its own
        raise NotImplementedError


_LOSS = re.compile(r"[a-z][a-z0-9_]{0,47}")


def dropped(kind: Any, suffix: str = "dropped") -> str:
    """The loss of a block or part of type `kind` (a client's own word: used only when it is a short snake_case
    name, else `unknown`), e.g. `document_dropped`."""
    word = kind if isinstance(kind, str) and _LOSS.fullmatch(kind) else "unknown"
    return f"{word}_{suffix}"


def obj(value: Any) -> Body:
    """`value` if it is an object, else an empty one: a lenient reading lets odd shapes through."""
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    """`value` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def named(losses: list[str], name: str) -> None:
    """Add `name` to `losses` once."""
    if name not in losses:
        losses.append(name)


def error_message(body: bytes) -> tuple[str, str | None]:
    """An upstream error body's message and type, whatever API's shape it has (OpenAI's `{"error": {"message"}}`,
    Anthropic's `{"type": "error", "error": {"type", "message"}}`, or plain text)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return (text[:500] or "the upstream answered an error without a body"), None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        message, kind = error.get("message"), error.get("type")
        return (message if isinstance(message, str) else json.dumps(error)), (kind if isinstance(kind, str) else None)
    if isinstance(error, str):
        return error, None
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return (message if isinstance(message, str) else json.dumps(parsed)[:500]), None
