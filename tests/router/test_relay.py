"""`relay` reads the transport's stream itself (not httpx's `aiter_raw`): a body over the buffer limit goes on from
where the buffering stopped, each byte once, whatever kind of stream the transport hands back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import Message

from router._asgi.relay import BUFFER_LIMIT, relay

pytestmark = pytest.mark.anyio

CHUNK = b"x" * 65536
BODY = b"".join(bytes([65 + index % 26]) * 65536 for index in range(BUFFER_LIMIT // 65536 + 8))  # ~1.5 MiB


class Pieces(httpx.AsyncByteStream):
    """A transport's stream in 64 KiB pieces; counts its closes."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.closed = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.body), 65536):
            yield self.body[start : start + 65536]

    async def aclose(self) -> None:
        self.closed += 1


async def relayed(response: httpx.Response) -> tuple[list[Message], bytes]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    assert await relay(response, send, [(b"x-d3-rule", b"default")])
    return sent, b"".join(message.get("body", b"") for message in sent[1:])


@pytest.mark.parametrize("kind", ["pieces", "bytestream"])
async def test_a_body_over_the_buffer_limit_arrives_whole_and_once(kind: str) -> None:
    stream: httpx.AsyncByteStream = Pieces(BODY) if kind == "pieces" else httpx.ByteStream(BODY)
    response = httpx.Response(200, headers=[(b"content-type", b"application/json")], stream=stream)
    sent, body = await relayed(response)
    assert sent[0]["status"] == 200
    assert (b"x-d3-rule", b"default") in sent[0]["headers"]
    assert len(body) == len(BODY) and body == BODY
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert response.is_closed
    if isinstance(stream, Pieces):
        assert stream.closed == 1


async def test_a_small_body_is_sent_in_one_message_with_its_headers_less_hop_by_hop() -> None:
    response = httpx.Response(200, headers=[(b"content-type", b"application/json"), (b"connection", b"close")],
                              stream=Pieces(b'{"ok": true}'))  # fmt: skip
    sent, body = await relayed(response)
    assert len(sent) == 2 and body == b'{"ok": true}'
    assert [name for name, _ in sent[0]["headers"]] == [b"content-type", b"x-d3-rule"]


async def test_an_event_stream_goes_on_chunk_by_chunk() -> None:
    response = httpx.Response(200, headers=[(b"content-type", b"text/event-stream")], stream=Pieces(CHUNK * 3))
    sent, body = await relayed(response)
    assert [len(message["body"]) for message in sent[1:]] == [65536, 65536, 65536, 0]
    assert body == CHUNK * 3


class Events(Pieces):
    """A stream whose close waits (as httpx's own pool does), noting when it closes among the messages sent."""

    def __init__(self, body: bytes, events: list[str]) -> None:
        super().__init__(body)
        self.events = events

    async def aclose(self) -> None:
        await asyncio.sleep(0)
        self.events.append("closed")


@pytest.mark.parametrize("content_type", [b"application/json", b"text/event-stream"])
async def test_the_upstream_response_is_closed_before_the_answer_ends(content_type: bytes) -> None:
    """Once the answer ends, the disconnect watcher may cancel the task: a close still to come would be cut short
    and leak its pooled connection (seen with httpx's pool: every request answered 503 after a few hundred)."""
    events: list[str] = []

    async def send(message: Message) -> None:
        events.append("end" if message["type"] == "http.response.body" and not message.get("more_body") else "sent")

    response = httpx.Response(200, headers=[(b"content-type", content_type)], stream=Events(b"data: 1\n\n", events))
    assert await relay(response, send, [])
    assert events.index("closed") < events.index("end")
    assert events.count("closed") == 1


async def test_headers_the_upstreams_connection_header_names_are_dropped() -> None:
    """RFC 9110 7.6.1: a header named in `Connection` is hop-by-hop. Before: relay dropped the fixed list only, and
    an upstream's `Connection: x-upstream-secret` let that header through to the client."""
    headers = [(b"content-type", b"application/json"), (b"connection", b"keep-alive, X-Upstream-Secret"),
               (b"x-upstream-secret", b"token"), (b"x-kept", b"1")]  # fmt: skip
    sent, body = await relayed(httpx.Response(200, headers=headers, content=b"{}"))
    names = [name.lower() for name, _ in sent[0]["headers"]]
    assert b"x-upstream-secret" not in names and b"connection" not in names
    assert b"x-kept" in names and body == b"{}"


class Breaks(httpx.AsyncByteStream):
    """An event stream that breaks off after its pieces, as an upstream killed mid-stream does."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.mark.parametrize(
    ("pieces", "tail"),
    [((b'data: {"a": 1}\n\n',), b""), ((b'data: {"a": 1}\n\n', b'data: {"a"'), b"\n\n"), ((), b"")],
    ids=["between-events", "inside-an-event", "before-any-event"],
)
async def test_a_stream_that_breaks_off_ends_with_the_apis_error_event(pieces: tuple[bytes, ...], tail: bytes) -> None:
    """Issue 24 (faults under load): a started stream whose upstream dies ends, whole, with the client API's error
    event (its own event, even when the cut fell inside one), not with a cut connection the SDKs report as a
    protocol error."""
    headers = [(b"content-type", b"text/event-stream")]
    response = httpx.Response(200, headers=headers, stream=Breaks(*pieces))
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    assert not await relay(response, send, [], "up", ending=lambda: b"event: error\ndata: {}\n\n")
    body = b"".join(message.get("body", b"") for message in sent[1:])
    assert body == b"".join(pieces) + tail + b"event: error\ndata: {}\n\n"
    assert sent[-1]["more_body"] is False
    assert response.is_closed


async def test_a_stream_that_breaks_off_without_an_ending_is_cut() -> None:
    response = httpx.Response(200, headers=[(b"content-type", b"text/event-stream")], stream=Breaks(b"data: 1\n\n"))
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    assert not await relay(response, send, [], "up")
    assert [message.get("more_body") for message in sent[1:]] == [True]
