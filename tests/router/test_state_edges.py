"""Decision state at its edges: which turn is read, budgets met exactly, media refused one by one, the exact words of
the refusals. Each test kills mutants mutmut found surviving (benchmarks/results/mutation.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies import StateSettings
from router import BadChatRequest, DecisionState, MediaRules, extract_state
from router._apis.chat import CHAT, Api, _on_fresh_stack
from router._apis.completions import COMPLETIONS
from router._apis.messages import MESSAGES
from router._apis.registry import detect
from router._apis.responses import RESPONSES
from router._errors import BadRequest

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
        ("data:image/png;base64x", "malformed data URL"),  # no comma: no header, whatever precedes it
        ("data: image/png;base64,AAAA", "malformed data URL"),  # the media type starts right after "data:"
        ("data:text/plain;base64,AAAA", "malformed data URL"),
    ],
)
def test_refusals_say_why(url: str, reason: str) -> None:
    assert state([user(url)]).dropped == (reason,)


AMBIGUOUS = r"^a media URL holds userinfo, a backslash, a space, a non-ASCII character or a host URL parsers read "


def test_an_http_url_without_a_host_is_refused_not_dropped() -> None:
    # Issue 25.6: was dropped as "host ? not in server.media_hosts"; urlsplit reads no host in it, WHATWG reads
    # only-a-path.png (special schemes skip extra slashes): two parsers disagree, so it is refused (400).
    with pytest.raises(BadRequest, match=AMBIGUOUS) as caught:
        state([user("http:///only-a-path.png")])
    assert caught.value.status == 400


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


# --- The API adapters at their edges: the field each refusal names, the words it says, the key headers, tool calls
# as the decision reads them (mutants of the adapters in router/_apis/).

LAST = StateSettings("last_user", 6000)
CONVERSATION = StateSettings("conversation", 6000)


def refusal(api: Api, body: dict[str, Any], lenient: bool = False) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        api.state(body, LAST, MediaRules(), lenient=lenient)
    return caught.value


def api_state(api: Api, body: dict[str, Any], lenient: bool = False) -> DecisionState:
    return api.state(body, CONVERSATION, MediaRules(), lenient=lenient)


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({}, "`prompt` is missing; expected a string or a list of strings", "prompt"),
        ({"prompt": {"a": 1}}, "`prompt` must be a string or a list of strings, found an object", "prompt"),
        ({"prompt": []}, "`prompt` is empty; expected a string or at least one string", "prompt"),
        ({"prompt": ["ok", None]}, "prompt[1] must be a string, found null", "prompt[1]"),
    ],
)
def test_completions_refusals_name_their_field(body: dict[str, Any], message: str, param: str) -> None:
    error = refusal(COMPLETIONS, body)
    assert (error.message, error.param, error.status) == (message, param, 400)


def test_a_responses_body_without_input_names_the_field() -> None:
    error = refusal(RESPONSES, {"model": "m"})
    assert (error.message, error.param) == ("`input` is missing; expected a string or a list of input items", "input")


def test_an_unknown_api_name_lists_the_known_ones_and_names_the_field() -> None:
    with pytest.raises(BadRequest) as caught:
        detect({}, "soap")
    assert caught.value.message == "unknown api 'soap'; expected one of chat, completions, responses, messages"
    assert caught.value.param == "api"


def test_an_unreadable_part_is_refused_with_the_setting_that_allows_it() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}
    error = refusal(CHAT, body)
    assert error.param == "messages[0].content[0].type"
    assert error.message == (
        "messages[0].content[0] has type 'input_audio', which d3-router cannot read for its decision; send text,"
        " images or videos, or set server.unknown_parts: ignore to leave such parts out of the decision"
    )


def test_every_unreadable_part_left_out_is_counted() -> None:
    parts = [{"type": "input_audio"}, {"type": "text", "text": "hi"}, {"type": "file"}]
    result = api_state(CHAT, {"messages": [{"role": "user", "content": parts}]}, lenient=True)
    assert (result.state, result.ignored) == ("user: hi", 2)


@pytest.mark.parametrize(
    ("function", "line"),
    [
        ({"name": "lookup"}, "[tool call] lookup()"),  # no arguments: empty parentheses, not "None"
        ({"name": "lookup", "arguments": '{"q": "x"}'}, '[tool call] lookup({"q": "x"})'),  # a string as it is
        ({"name": "lookup", "arguments": {"q": "é"}}, '[tool call] lookup({"q": "é"})'),  # an object as JSON
    ],
)
def test_an_assistants_tool_call_reads_as_its_name_and_arguments(function: dict[str, Any], line: str) -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": function}]}
    assert api_state(CHAT, {"messages": [message]}).state == f"assistant: {line}"


def test_an_anthropic_tool_input_keeps_its_non_ascii_text() -> None:
    block = {"type": "tool_use", "id": "t1", "name": "say", "input": {"text": "grüße"}}
    body = {"messages": [{"role": "assistant", "content": [block]}]}
    assert api_state(MESSAGES, body).state == 'assistant: [tool call] say({"text": "grüße"})'


def test_an_anthropic_image_source_without_a_type_names_the_field() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "image", "source": {"data": "x"}}]}]}
    error = refusal(MESSAGES, body)
    assert error.param == "messages[0].content[0].source.type"
    assert error.message == "messages[0].content[0].source.type must be base64 or url, found null"


def test_an_anthropic_image_of_an_unknown_source_left_out_is_neither_kept_nor_dropped() -> None:
    image = {"type": "image", "source": {"type": "file", "file_id": "f1"}}
    body = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "see"}]}]}
    result = api_state(MESSAGES, body, lenient=True)
    assert (result.images, result.dropped, result.ignored) == ((), (), 1)


def test_an_http_url_that_cannot_be_split_is_refused_as_malformed() -> None:
    # Issue 25.6: was dropped ("malformed URL"); a URL urlsplit cannot read is one parsers may read differently,
    # refused (400) before the engine or an upstream sees it.
    part = {"type": "image_url", "image_url": {"url": "http://[::1/x.png"}}
    with pytest.raises(BadRequest, match=AMBIGUOUS) as caught:
        api_state(CHAT, {"messages": [{"role": "user", "content": [part]}]})
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("api", "header", "value"),
    [(CHAT, b"authorization", b"Bearer sk-\xe9?"), (MESSAGES, b"x-api-key", b"sk-\xe9?")],
)
def test_the_key_header_is_lower_case_and_a_key_outside_latin_1_is_replaced_not_raised(
    api: Api, header: bytes, value: bytes
) -> None:
    # HTTP/2 and ASGI want lower-case header names; a key with a character latin-1 lacks is sent with `?` for it.
    assert api.key_headers("sk-é€") == [(header, value)]


def test_a_body_is_encoded_on_a_fresh_stack_and_one_too_deep_for_any_stack_is_refused() -> None:
    assert _on_fresh_stack({"model": "m", "n": [1, "é"]}) == b'{"model":"m","n":[1,"\xc3\xa9"]}'
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(BadRequest, match=r"^the request body is nested too deeply to be forwarded$") as caught:
        _on_fresh_stack({"messages": deep})
    assert (caught.value.status, caught.value.param) == (400, None)


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"system": "s"}, "`messages` is missing; expected a list of messages", "messages"),
        ({"messages": []}, "`messages` is empty; expected at least one message", "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role must be one of assistant, system, user",
         "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]},
         "messages[0].content must be a string or a list of content blocks, found a number", "messages[0].content"),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0] must be an object with a `type`",
         "messages[0].content[0]"),
        ({"system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]},
         "system[0] has type 'image'; `system` takes text blocks only", "system[0].type"),
    ],
)  # fmt: skip
def test_anthropic_refusals_name_their_field(body: dict[str, Any], message: str, param: str) -> None:
    error = refusal(MESSAGES, body)
    assert (error.message, error.param) == (message, param)


def test_an_anthropic_tool_result_without_content_is_an_empty_tool_turn() -> None:
    block = {"type": "tool_result", "tool_use_id": "t1"}
    result = MESSAGES.state(
        {"messages": [{"role": "user", "content": [block]}]}, StateSettings("json", 6000), MediaRules()
    )
    assert result.state == [{"role": "tool", "content": ""}]


def test_a_message_of_tool_results_only_adds_no_empty_user_turn() -> None:
    result = [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]
    body = {"messages": [{"role": "user", "content": "the question"}, {"role": "user", "content": result}]}
    assert refusal_free(body, "last_user") == "the question"
    assert refusal_free(body, "json") == [
        {"role": "user", "content": "the question"},
        {"role": "tool", "content": "42"},
    ]


def test_an_image_beside_a_tool_result_is_kept() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    blocks = [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}, image]
    result = MESSAGES.state({"messages": [{"role": "user", "content": blocks}]}, LAST, MediaRules())
    assert result.images == (png,)


def test_an_empty_anthropic_content_list_is_still_a_turn() -> None:
    body = {"messages": [{"role": "user", "content": []}]}
    assert refusal_free(body, "conversation") == "user: "


def refusal_free(body: dict[str, Any], source: str) -> Any:
    return MESSAGES.state(body, StateSettings(source, 6000), MediaRules()).state  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(500, "api_error"), (502, "api_error"), (499, "invalid_request_error"), (503, "overloaded_error"),
     (403, "permission_error")],
)  # fmt: skip
def test_anthropic_errors_are_typed_by_status(status: int, kind: str) -> None:
    assert json.loads(MESSAGES.error(status, "m", "ignored")) == {
        "type": "error",
        "error": {"type": kind, "message": "m"},
    }


def responses(*items: Any, source: str = "json", lenient: bool = False) -> Any:
    body = {"input": list(items)}
    return RESPONSES.state(body, StateSettings(source, 6000), MediaRules(), lenient=lenient)  # type: ignore[arg-type]


def test_a_responses_string_input_is_a_user_turn() -> None:
    body = {"instructions": "be brief", "input": "hi"}
    result = RESPONSES.state(body, StateSettings("json", 6000), MediaRules())
    assert result.state == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_responses_items_of_every_kind_read_as_their_turns() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    items = [
        {"role": "system", "content": "rules"},
        {"type": "function_call", "name": "f", "call_id": "c1"},
        {"type": "custom_tool_call", "name": "g", "input": "raw text", "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image", "image_url": png}]},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
    ]
    result = responses(*items)
    assert result.state == [
        {"role": "system", "content": "rules"},
        {"role": "assistant", "content": "[tool call] f()"},
        {"role": "assistant", "content": "[tool call] g(raw text)"},
        {"role": "tool", "content": ""},
        {"role": "tool", "content": "done"},
    ]
    assert result.images == (png,)


def test_unreadable_parts_of_tool_outputs_and_summaries_are_counted() -> None:
    items = [
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_file", "file_id": "f"}]},
        {"type": "reasoning", "summary": [{"type": "input_audio"}]},
        {"role": "user", "content": "hi"},
    ]
    assert responses(*items, lenient=True).ignored == 2
    with pytest.raises(BadRequest) as caught:
        responses(*items[1:])
    assert caught.value.param == "input[0].summary[0].type"


@pytest.mark.parametrize(
    ("items", "message", "param"),
    [
        ([], "`input` is empty; expected at least one item", "input"),
        ([{"role": "tool", "content": "x"}], "input[0].role must be one of assistant, developer, system, user",
         "input[0].role"),
        ([{"type": 3}], "input[0].type must be a string", "input[0].type"),
        (["x"], "input[0] must be an input item (an object)", "input[0]"),
        ([{"type": "reasoning", "summary": "x"}], "input[0].summary must be a list, found a string", "input[0].summary"),
    ],
)  # fmt: skip
def test_responses_refusals_name_their_field(items: list[Any], message: str, param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        responses(*items)
    assert (caught.value.message, caught.value.param) == (message, param)


def test_a_legacy_function_call_reads_as_a_tool_call() -> None:
    message = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}
    assert api_state(CHAT, {"messages": [message]}).state == "assistant: [tool call] f({})"


def test_the_chat_error_body_carries_its_code_and_param() -> None:
    error = json.loads(CHAT.error(400, "bad", "invalid_request_error", "bad_field", "messages"))
    assert error == {
        "error": {"message": "bad", "type": "invalid_request_error", "code": "bad_field", "param": "messages"}
    }


def test_rewrite_skips_a_parameter_the_api_cannot_take_and_sets_the_rest() -> None:
    body = {"model": "m", "prompt": "hi"}
    raw = COMPLETIONS.rewrite(b"", body, None, {"reasoning_effort": "high", "temperature": 0.5})
    assert json.loads(raw) == {"model": "m", "prompt": "hi", "temperature": 0.5}


def test_rewrite_replaces_a_nested_parameters_holder_that_is_not_an_object() -> None:
    body = {"model": "m", "input": "hi", "reasoning": "fast"}
    raw = RESPONSES.rewrite(b"", body, None, {"reasoning_effort": "high"})
    assert json.loads(raw) == {"model": "m", "input": "hi", "reasoning": {"effort": "high"}}


def test_a_body_the_stack_in_use_cannot_encode_is_encoded_on_a_fresh_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import router._apis.chat
    from d3backend import json_bytes

    threads: list[str] = []

    def on_a_short_stack(body: Any) -> bytes:  # the request thread's stack is used up; a new thread's is not
        threads.append(threading.current_thread().name)
        if threading.current_thread() is threading.main_thread():
            raise RecursionError
        return json_bytes(body)

    monkeypatch.setattr(router._apis.chat, "json_bytes", on_a_short_stack)
    assert CHAT.rewrite(b"", {"model": "m", "messages": []}, "big", {}) == b'{"model":"big","messages":[]}'
    assert threads == ["MainThread", "d3-rewrite"]


def test_tool_calls_that_are_not_a_list_name_their_field() -> None:
    message = {"role": "assistant", "content": "x", "tool_calls": "f()"}
    error = refusal(CHAT, {"messages": [message]})
    assert (error.message, error.param) == (
        "messages[0].tool_calls must be a list, found a string",
        "messages[0].tool_calls",
    )


def test_an_assistants_text_and_tool_calls_are_one_turn_line_by_line_and_odd_calls_are_left_out() -> None:
    calls = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}, "junk", {"type": "function"}]
    message = {"role": "assistant", "content": "let me look", "tool_calls": calls}
    assert api_state(CHAT, {"messages": [message]}).state == "assistant: let me look\n[tool call] f({})"


@pytest.mark.parametrize(
    ("field", "param"),
    [
        ("tool_calls", "messages[0].tool_calls[0].function.arguments"),
        ("function_call", "messages[0].function_call.arguments"),
    ],
)
def test_tool_call_arguments_too_deep_to_read_name_their_field(field: str, param: str) -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    function = {"name": "f", "arguments": deep}
    call = [{"type": "function", "function": function}] if field == "tool_calls" else function
    error = refusal(CHAT, {"messages": [{"role": "assistant", "content": None, field: call}]})
    assert (error.message, error.param) == (f"{param} is nested too deeply to be read for the decision", param)


def test_build_state_of_no_turns_is_empty_and_counts_nothing_ignored() -> None:
    from router._apis.state import build_state

    assert build_state([], StateSettings("last_user", 100)) == DecisionState("")


def test_the_media_limit_is_inclusive_and_its_refusal_names_the_setting() -> None:
    from router._apis.state import Turn, build_state

    png = "data:image/png;base64,iVBORw0KGgo="
    three = [Turn("user", "see", (("image", png),) * 3)]
    assert len(build_state(three, LAST, MediaRules(max_items=3)).images) == 3
    with pytest.raises(BadRequest) as caught:
        build_state(three, LAST, MediaRules(max_items=2))
    assert caught.value.status == 413
    assert caught.value.message == (
        "the request hands 3 images and videos to the decision; at most 2 are allowed (server.max_media_items)"
    )


def test_an_input_image_url_that_is_not_a_string_names_its_field() -> None:
    part = {"type": "input_image", "image_url": {"url": "x"}}
    error = refusal(RESPONSES, {"input": [{"role": "user", "content": [part]}]})
    assert error.param == "input[0].content[0].image_url"
    assert error.message == "input[0].content[0].image_url must be a string (an https or data URL), found an object"


def test_a_duplicate_key_is_named_not_the_first_key_of_its_object() -> None:
    from router._apis.body import parse_json

    with pytest.raises(BadRequest) as caught:
        parse_json(b'{"a": 1, "b": 2, "b": 3}')
    assert caught.value.message == "the request body gives the key 'b' twice; send each key once"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"a": "\xff"}', "the request body is not a JSON object: invalid UTF-8"),
        (b"{", "the request body is not a JSON object: invalid JSON"),
        (b"[]", "the request body must be a JSON object"),
    ],
)
def test_a_body_that_is_not_a_json_object_says_why(raw: bytes, message: str) -> None:
    from router._apis.body import parse_json

    with pytest.raises(BadRequest) as caught:
        parse_json(raw)
    assert (caught.value.message, caught.value.status) == (message, 400)


def test_a_request_without_a_content_type_is_read_as_json() -> None:
    import anyio

    from router._apis.body import read_request

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"model": "m"}', "more_body": False}

    async def read() -> tuple[bytes, dict[str, Any]]:
        return await read_request({"type": "http", "headers": []}, receive, 1000)

    assert anyio.run(read) == (b'{"model": "m"}', {"model": "m"})


def test_a_legacy_function_message_is_a_tool_turn() -> None:
    body = {"messages": [{"role": "function", "name": "f", "content": "42"}]}
    assert CHAT.state(body, StateSettings("json", 100), MediaRules()).state == [{"role": "tool", "content": "42"}]


def test_unknown_parts_are_refused_unless_the_caller_says_otherwise() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}
    with pytest.raises(BadRequest):
        CHAT.state(body, LAST, MediaRules())


def test_an_anthropic_system_message_between_turns_is_read_as_a_system_turn() -> None:
    """Claude Code (2.1) sends `{"role": "system"}` messages inside `messages` (issue 26): judged, not refused."""
    messages = [{"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "agents"}]}]
    result = MESSAGES.state({"messages": messages}, StateSettings("json", 6000), MediaRules())
    assert result.state == [{"role": "user", "content": "hi"}, {"role": "system", "content": "agents"}]
