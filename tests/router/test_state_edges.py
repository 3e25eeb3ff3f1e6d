"""Decision state at its edges: which turn is read, budgets met exactly, media refused one by one, the exact words of
the refusals. Each test kills mutants mutmut found surviving (benchmarks/results/mutation.md)."""

from __future__ import annotations

from typing import Any

import pytest

from policies import StateSettings
from router import BadChatRequest, DecisionState, MediaRules, extract_state

PNG = "data:image/png;base64,iVBORw0KGgo="
MP4 = "data:video/mp4;base64,AAAAIGZ0eXA="
HOSTS = frozenset({"img.example.com"})


def state(messages: Any, source: str = "last_user", max_chars: int = 6000, media: MediaRules | None = None) -> Any:
    return extract_state(messages, StateSettings(source, max_chars), media or MediaRules(hosts=HOSTS))  # type: ignore[arg-type]


def user(*urls: str, text: str = "see") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"role": "user", "content": parts}


def test_last_user_skips_the_turns_after_the_last_user_turn() -> None:
    messages = [{"role": "user", "content": "first"}, {"role": "user", "content": "the question"},
                {"role": "assistant", "content": "an answer"}, {"role": "tool", "content": "a result"}]  # fmt: skip
    assert state(messages).state == "the question"


def test_last_user_without_a_user_turn_reads_the_last_turn_only() -> None:
    messages = [{"role": "system", "content": "rules"}, {"role": "assistant", "content": "hello"}]
    assert state(messages) == DecisionState("hello")


def test_a_conversation_budget_counts_the_blank_line_between_turns() -> None:
    messages = [{"role": "user", "content": "abcdef"}, {"role": "assistant", "content": "xyz"}]
    # "assistant: xyz" is 14 characters and the blank line 2: 4 are left for the end of "user: abcdef".
    result = state(messages, "conversation", max_chars=20)
    assert result.state == "cdef\n\nassistant: xyz"
    assert result.truncated == len("user: ab")


def test_a_json_budget_stops_when_it_is_used_up_and_cuts_into_an_older_turn_with_room_left() -> None:
    messages = [{"role": "user", "content": "aaa"}, {"role": "user", "content": "bbbb"}]
    assert state(messages, "json", max_chars=4).state == [{"role": "user", "content": "bbbb"}]  # nothing left: no ""
    assert state(messages, "json", max_chars=5).state == [{"role": "user", "content": "bbbb"}]  # the separator
    assert state(messages, "json", max_chars=6).state == [{"role": "user", "content": "a"},
                                                           {"role": "user", "content": "bbbb"}]  # fmt: skip


def test_a_data_url_exactly_at_the_budget_passes_and_the_next_byte_does_not() -> None:
    assert state([user(PNG)], media=MediaRules(max_bytes=len(PNG))).images == (PNG,)
    over = state([user(PNG)], media=MediaRules(max_bytes=len(PNG) - 1))
    assert (over.images, over.dropped) == ((), ("data URLs over the media budget",))


def test_the_media_budget_adds_up_every_data_url_and_only_data_urls() -> None:
    web = "https://img.example.com/a.png"
    rules = MediaRules(hosts=HOSTS, max_bytes=2 * len(PNG) + len(web))  # room for two, not three
    result = state([user(PNG, web, PNG, PNG)], media=rules)
    assert result.images == (PNG, web, PNG)
    assert result.dropped == ("data URLs over the media budget",)


def test_a_refused_item_does_not_stop_the_items_after_it() -> None:
    parts = [{"type": "image_url", "image_url": {}}, {"type": "image_url", "image_url": {"url": "ftp://x/a.png"}},
             {"type": "image_url", "image_url": {"url": PNG}}, {"type": "video_url", "video_url": {"url": MP4}}]  # fmt: skip
    result = state([{"role": "user", "content": parts}])
    assert (result.images, result.videos) == ((PNG,), (MP4,))
    assert result.dropped == ("image without a url", "scheme ftp not allowed")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("no-scheme-at-all", "scheme ? not allowed"),
        ("http:///only-a-path.png", "host ? not in server.media_hosts"),
        ("data:image/png;base64x", "malformed data URL"),  # no comma: no header, whatever precedes it
        ("data: image/png;base64,AAAA", "malformed data URL"),  # the media type starts right after "data:"
        ("data:text/plain;base64,AAAA", "malformed data URL"),
    ],
)
def test_refusals_say_why(url: str, reason: str) -> None:
    assert state([user(url)]).dropped == (reason,)


@pytest.mark.parametrize(
    "url",
    ["https://img.example.com:8443/a.png", "HTTPS://IMG.EXAMPLE.COM/a.png", "data:image/png;base64,AAAA,BBBB"],
)
def test_accepted_media(url: str) -> None:
    assert state([user(url)]).images == (url,)  # a port, upper case, a comma in the payload: the header ends first


@pytest.mark.parametrize(
    ("messages", "found"),
    [(True, "a boolean"), ([None], "null"), ([["user", "hi"]], "a list"), ([{"role": "user", "content": 3}], "a number")],
)  # fmt: skip
def test_bad_messages_name_what_was_found(messages: Any, found: str) -> None:
    with pytest.raises(BadChatRequest) as caught:
        state(messages)
    assert caught.value.message.endswith(f"found {found}")
