"""The translations' event reader is the router's one event-stream reader (router/_asgi/sse.py): any line ends,
cut anywhere, give the same events."""

from __future__ import annotations

import pytest

from router._translate.base import SseEvent, SseReader

STREAM = b': keep-alive\r\n\r\nevent: message_start\r\ndata: {"a": 1}\r\n\r\ndata: line one\rdata: two\r\r'
EVENTS = [SseEvent("message_start", '{"a": 1}'), SseEvent(None, "line one\ntwo")]


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_any_cut_of_a_stream_with_any_line_ends_gives_its_events(cut: int) -> None:
    reader = SseReader()
    events = [*reader.feed(STREAM[:cut]), *reader.feed(STREAM[cut:]), *reader.flush()]
    assert events == EVENTS
