"""Decision state from chat messages: sources, parts, media rules, the budget, and bad messages."""

from __future__ import annotations

import re
from typing import Any

import pytest

from policies import StateSettings
from router import BadChatRequest, DecisionState, MediaRules, extract_state

PNG = "data:image/png;base64,iVBORw0KGgo="
MP4 = "data:video/mp4;base64,AAAAIGZ0eXA="
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "First question"},
    {"role": "assistant", "content": "First answer"},
    {"role": "user", "content": [{"type": "text", "text": "Look at"}, {"type": "image_url", "image_url": {"url": PNG}},
                                 {"type": "text", "text": "this"}]},
]  # fmt: skip


def state(
    messages: Any, source: str = "last_user", max_chars: int = 6000, media: MediaRules | None = None
) -> DecisionState:
    return extract_state(messages, StateSettings(source, max_chars), media or MediaRules())  # type: ignore[arg-type]


def test_last_user_turn_joins_text_parts_and_takes_its_media() -> None:
    assert state(CONVERSATION) == DecisionState("Look at\nthis", images=(PNG,))


def test_conversation_transcript() -> None:
    result = state(CONVERSATION, "conversation")
    assert result.state == "system: Be brief.\n\nuser: First question\n\nassistant: First answer\n\nuser: Look at\nthis"
    assert result.images == (PNG,)


def test_json_state() -> None:
    assert state(CONVERSATION[:3], "json").state == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
    ]


def test_without_a_user_turn_the_last_message_is_read() -> None:
    assert state([{"role": "system", "content": "only a system prompt"}]).state == "only a system prompt"


def test_null_content_and_parts_the_router_cannot_read() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}, {"type": "text", "text": "again"}]},
    ]
    with pytest.raises(BadChatRequest, match=r"^messages\[2\]\.content\[0\] has type 'input_audio', which d3-router"):
        state(messages, "conversation")
    lenient = extract_state(messages, StateSettings("conversation", 6000), lenient=True)
    assert lenient.state == "user: hi\n\nassistant: \n\nuser: again"
    assert lenient.ignored == 1


def test_budget_cuts_the_oldest_text_first() -> None:
    long = "a" * 50 + "b" * 50
    result = state([{"role": "user", "content": long}], max_chars=60)
    assert result.state == "a" * 10 + "b" * 50
    assert result.truncated == 40
    transcript = state(CONVERSATION, "conversation", max_chars=30)
    assert transcript.state.endswith("user: Look at\nthis")
    assert "Be brief" not in transcript.state
    assert transcript.truncated > 0
    assert len(transcript.state) <= 30
    json_state = state(CONVERSATION, "json", max_chars=20)
    assert json_state.state == [
        {"role": "assistant", "content": " answer"},
        {"role": "user", "content": "Look at\nthis"},
    ]
    assert json_state.truncated == 28


@pytest.mark.parametrize(
    ("part", "rules", "kept", "dropped"),
    [
        ({"type": "image_url", "image_url": {"url": PNG}}, MediaRules(), ((PNG,), ()), ()),
        ({"type": "video_url", "video_url": {"url": MP4}}, MediaRules(), ((), (MP4,)), ()),
        ({"type": "image_url", "image_url": PNG}, MediaRules(), ((PNG,), ()), ()),
        (
            {"type": "image_url", "image_url": {"url": "https://img.example.com/a.png"}},
            MediaRules(frozenset({"img.example.com"})),
            (("https://img.example.com/a.png",), ()),
            (),
        ),
        (
            {"type": "image_url", "image_url": {"url": "https://evil.example.com/a.png"}},
            MediaRules(frozenset({"img.example.com"})),
            ((), ()),
            ("host evil.example.com not in server.media_hosts",),
        ),
        (
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}},
            MediaRules(),
            ((), ()),
            ("host 169.254.169.254 not in server.media_hosts",),
        ),
        (
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
            MediaRules(),
            ((), ()),
            ("scheme file not allowed",),
        ),
        (
            {"type": "image_url", "image_url": {"url": "ftp://x/y.png"}},
            MediaRules(),
            ((), ()),
            ("scheme ftp not allowed",),
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:text/html;base64,PGI+"}},
            MediaRules(),
            ((), ()),
            ("malformed data URL",),
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png,raw"}},
            MediaRules(),
            ((), ()),
            ("malformed data URL",),
        ),
        (
            {"type": "image_url", "image_url": {"url": PNG}},
            MediaRules(max_bytes=10),
            ((), ()),
            ("data URLs over the media budget",),
        ),
        ({"type": "image_url", "image_url": {}}, MediaRules(), ((), ()), ("image without a url",)),
    ],
)
def test_media_rules(
    part: dict[str, Any], rules: MediaRules, kept: tuple[tuple[str, ...], tuple[str, ...]], dropped: tuple[str, ...]
) -> None:
    result = state([{"role": "user", "content": [{"type": "text", "text": "see"}, part]}], media=rules)
    assert (result.images, result.videos) == kept
    assert result.dropped == dropped
    assert result.state == "see"


@pytest.mark.parametrize(
    ("messages", "message", "param"),
    [
        (None, "`messages` is missing; expected a list of chat messages", "messages"),
        ("hello", "`messages` must be a list, found a string", "messages"),
        ({"role": "user"}, "`messages` must be a list, found an object", "messages"),
        ([], "`messages` is empty; expected at least one message", "messages"),
        (["hello"], "messages[0] must be an object with `role` and `content`, found a string", "messages[0]"),
        (
            [{"content": "x"}],
            "messages[0].role must be one of assistant, developer, function, system, tool, user",
            "messages[0].role",
        ),
        (
            [{"role": "king", "content": "x"}],
            "messages[0].role must be one of assistant, developer, function, system, tool, user",
            "messages[0].role",
        ),
        (
            [{"role": "user", "content": 42}],
            "messages[0].content must be a string or a list of content parts, found a number",
            "messages[0].content",
        ),
        (
            [{"role": "user", "content": {"text": "x"}}],
            "messages[0].content must be a string or a list of content parts, found an object",
            "messages[0].content",
        ),
        (
            [{"role": "user", "content": ["x"]}],
            "messages[0].content[0] must be an object with a `type`",
            "messages[0].content[0]",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 3}]}],
            "messages[0].content[0].text must be a string, found a number",
            "messages[0].content[0].text",
        ),
    ],
)
def test_bad_messages(messages: Any, message: str, param: str) -> None:
    with pytest.raises(BadChatRequest, match=f"^{re.escape(message)}$") as info:
        state(messages)
    assert info.value.param == param


def test_ten_thousand_messages_are_budgeted() -> None:
    messages = [{"role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(10_000)]
    result = state(messages, "conversation", max_chars=200)
    assert len(result.state) <= 200
    assert result.state.endswith("user: message 9999")


AGENT_TURN = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "fix the bug"},
    {"role": "assistant", "content": "Looking", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "def f(): pass"},
    {"role": "user", "content": "and hurry"},
]  # fmt: skip


def test_new_is_a_transcript_of_the_last_calls_and_what_came_after() -> None:
    """`from: new` through the state builder: the assistant's last tool calls (not its words), then every later
    turn but system prompts, as `role: text` lines like `conversation`'s; not the last user turn alone."""
    assert state(AGENT_TURN, "new").state == (
        'assistant: [tool call] read({"path": "a.py"})\n\ntool: def f(): pass\n\nuser: and hurry'
    )
    assert state(AGENT_TURN, "new", max_chars=30).state == "tool: def f(): pass\n\nuser: and hurry"[-30:]
