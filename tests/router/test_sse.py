"""The one event-stream reader (router/_asgi/sse.py, issue 27.5): events cut where a blank line ends them, whatever
the line ends and wherever the chunks are cut; their data read as the event-stream grammar says."""

from __future__ import annotations

import pytest

from router._asgi.sse import (
    EventReader,
    EventTooLarge,
    data_of,
    ends_event,
    event_end,
    event_start,
    events,
    json_data,
    last_boundary,
)

STREAMS = {
    "lf": b'data: {"a": 1}\n\nevent: x\ndata: {"b": 2}\n\n: keep-alive\n\ndata: [DONE]\n\n',
    "crlf": b'data: {"a": 1}\r\n\r\nevent: x\r\ndata: {"b": 2}\r\n\r\n: keep-alive\r\n\r\ndata: [DONE]\r\n\r\n',
    "cr": b'data: {"a": 1}\r\revent: x\rdata: {"b": 2}\r\r: keep-alive\r\rdata: [DONE]\r\r',
    "mixed": b'data: {"a": 1}\r\n\nevent: x\ndata: {"b": 2}\n\r\n: keep-alive\r\r\ndata: [DONE]\n\n',
}


def fed(stream: bytes, cuts: list[int]) -> list[bytes]:
    reader = EventReader()
    out: list[bytes] = []
    at = 0
    for cut in [*cuts, len(stream)]:
        out += reader.feed(stream[at:cut])
        at = cut
    rest = reader.close()
    return [*out, rest] if rest else out


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_a_stream_cuts_into_its_four_events_whatever_its_line_ends(name: str) -> None:
    cut = list(events(STREAMS[name]))
    assert b"".join(cut) == STREAMS[name], "the events are the bytes as they came"
    assert [data_of(event) for event in cut] == [b'{"a": 1}', b'{"b": 2}', None, b"[DONE]"]
    assert [json_data(event) for event in cut] == [{"a": 1}, {"b": 2}, None, None]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_every_cut_of_the_chunks_gives_the_same_events(name: str) -> None:
    stream = STREAMS[name]
    whole = list(events(stream))
    for cut in range(len(stream) + 1):
        assert fed(stream, [cut]) == whole, f"cut at {cut}: {stream[:cut]!r}"
    assert fed(stream, list(range(1, len(stream)))) == whole, "one byte at a time"


def test_a_crlf_cut_between_its_cr_and_lf_is_held_until_the_lf_comes() -> None:
    reader = EventReader()
    assert reader.feed(b"data: 1\r\n\r") == [], "the \\r may be the start of \\r\\n"
    assert reader.feed(b"\ndata: 2") == [b"data: 1\r\n\r\n"]
    assert reader.close() == b"data: 2"


def test_a_lone_cr_at_the_end_is_given_back_on_close() -> None:
    reader = EventReader()
    assert reader.feed(b"data: 1\r\r") == []
    assert reader.close() == b"data: 1\r\r"
    assert ends_event(b"data: 1\r\r")
    assert not ends_event(b"data: 1\r\n")


def test_multi_line_data_is_joined_by_newlines_less_one_space_each() -> None:
    event = b"event: note\ndata: first\ndata:second\ndata:  third\ndata\nid: 7\n\n"
    assert data_of(event) == b"first\nsecond\n third\n"


@pytest.mark.parametrize(
    "event",
    [b": a comment\n\n", b"event: ping\n\n", b"id: 3\nretry: 10\n\n", b"database: x\n\n", b"\n", b""],
)
def test_an_event_without_data_has_none(event: bytes) -> None:
    assert data_of(event) is None
    assert json_data(event) is None


def test_a_comment_between_data_lines_is_skipped() -> None:
    assert data_of(b'data: {"a":\n: note\ndata: 1}\n\n') == b'{"a":\n1}'
    assert json_data(b'data: {"a":\n: note\ndata: 1}\n\n') == {"a": 1}


def test_json_data_takes_objects_only() -> None:
    assert json_data(b"data: [1, 2]\n\n") is None
    assert json_data(b"data: {broken\n\n") is None


def test_an_event_over_the_limit_is_refused_naming_the_setting() -> None:
    reader = EventReader(10, "answer.max_answer_bytes")
    assert reader.feed(b"data: 12\n\n") == [b"data: 12\n\n"], "a whole event is never held"
    with pytest.raises(EventTooLarge, match=r"^a streamed event is larger than answer\.max_answer_bytes \(10\)$"):
        reader.feed(b"data: 12345")


def test_whole_gives_every_finished_event_at_once() -> None:
    reader = EventReader()
    assert reader.whole(b"data: 1\n\ndata: 2\r\n\r\ndata: 3") == b"data: 1\n\ndata: 2\r\n\r\n"
    assert reader.whole(b"\r\n\r") == b"", "the \\r may start a \\r\\n"
    assert reader.whole(b"\n") == b"data: 3\r\n\r\n"
    assert reader.close() == b""


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_event_around_a_byte_is_found_both_ways(name: str) -> None:
    stream = STREAMS[name]
    at = 0
    for event in events(stream):
        for inside in range(at, at + len(event.rstrip(b"\r\n"))):
            assert (event_start(stream, inside), event_end(stream, inside)) == (at, at + len(event)), inside
        at += len(event)
    assert last_boundary(stream, final=True) == len(stream)
    assert (last_boundary(stream) == len(stream)) is (not stream.endswith(b"\r")), "a last \r may start a \r\n"
    assert last_boundary(b"data: 1") == -1
