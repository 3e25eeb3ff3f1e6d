"""The adapters' own bytes, checked field by field where the mutation run (benchmarks/results/mutation.md, issue 23)
found them unchecked: the answer that replaces a withheld one, the mid-stream error events, the model list, the
usage a stream's events carry, completions' text read from several choices, the videos a request counts, and what
`state: {from: new}` reads.
Each shape is the API's; the SDKs read them here through their own clients and types (tests/router/_sdk_shapes.py)."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pydantic
import pytest
from anthropic.types import Message
from openai.types import Completion, Model
from openai.types.responses import ResponseErrorEvent

from policies import StateSettings
from router import API_BY_NAME
from router._apis import answers
from router._apis.answers import FOLLOWERS, Answered, Call, Followed, read_answer, replacement
from router._apis.chat import extract_state
from router._apis.facts import estimate_tokens, request_facts
from router._apis.registry import error_api
from router._apis.state import DEFAULT_MEDIA, Turn, since_assistant
from router._apis.usage import UsageReader
from router._errors import BadRequest, ModelNotFound, RateLimited, RequestError, Unauthorized, answer
from router._observe.usage import Tokens
from tests.router import _sdk_shapes

NOW, HEX = 1_700_000_000, "0123456789abcdef01234567"  # the frozen clock and the first 24 digits of the frozen uuid
TEXT, MODEL = "The answer was withheld.", "small-model"


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replacement's clock and ids fixed, so that its every field can be compared."""
    monkeypatch.setattr(answers, "time", SimpleNamespace(time=lambda: NOW + 0.75))
    monkeypatch.setattr(answers, "uuid", SimpleNamespace(uuid4=lambda: uuid.UUID(HEX + "89abcdef")))


def known(model: pydantic.BaseModel, where: str = "answer") -> None:
    """No key the SDK's type does not know, at any depth (the SDKs' models keep unknown keys as extras)."""
    extra = sorted(model.model_extra or {})
    if extra:
        raise AssertionError(f"{where} has keys the SDK's type does not know: {extra}")
    for name in type(model).model_fields:
        value = getattr(model, name)
        for index, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, pydantic.BaseModel):
                known(item, f"{where}.{name}[{index}]")


def client_of(kind: type[Any], body: bytes, *, stream: bool = False) -> Any:
    """An SDK client whose every request is answered with `body` (the anthropic SDK brings its own HTTP package,
    httpx2, with the same mock transport)."""
    http: Any = httpx2 if kind is anthropic.Anthropic else httpx
    headers = {"content-type": "text/event-stream" if stream else "application/json"}
    transport = http.MockTransport(lambda request: http.Response(200, content=body, headers=headers))
    return kind(api_key="sk-test", base_url="http://router.test/v1", max_retries=0,
                http_client=http.Client(transport=transport))  # fmt: skip


# --- the answer that replaces a withheld one ---------------------------------------------------------------------
def test_a_replaced_completions_answer_is_openais_text_completion(frozen: None) -> None:
    body, kind = replacement("completions", TEXT, MODEL, streamed=False)
    assert kind == b"application/json"
    answer = json.loads(body)
    assert answer == {
        "id": f"cmpl-{HEX}", "object": "text_completion", "created": NOW, "model": MODEL,
        "choices": [{"index": 0, "text": TEXT, "finish_reason": "stop", "logprobs": None}],
    }  # fmt: skip
    known(Completion.model_validate(answer))


MESSAGE_ITEM = {"type": "message", "id": f"msg_{HEX}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": TEXT, "annotations": []}]}  # fmt: skip
RESPONSE = {"id": f"resp_{HEX}", "object": "response", "created_at": NOW, "model": MODEL, "status": "completed",
            "output": [MESSAGE_ITEM]}  # fmt: skip


def test_a_replaced_chat_answer_is_openais_chat_completion(frozen: None) -> None:
    body, _ = replacement("chat", TEXT, MODEL, streamed=False)
    answer = json.loads(body)
    assert answer == {
        "id": f"chatcmpl-{HEX}", "object": "chat.completion", "created": NOW, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
    }  # fmt: skip
    known(_sdk_shapes.completion(answer))


def test_a_replaced_messages_answer_is_anthropics_message(frozen: None) -> None:
    body, _ = replacement("messages", TEXT, MODEL, streamed=False)
    answer = json.loads(body)
    assert answer == {
        "id": f"msg_{HEX}", "type": "message", "role": "assistant", "model": MODEL,
        "content": [{"type": "text", "text": TEXT}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }  # fmt: skip
    known(_sdk_shapes.message(answer))


def test_a_replaced_responses_answer_is_one_completed_message(frozen: None) -> None:
    body, _ = replacement("responses", TEXT, MODEL, streamed=False)
    assert json.loads(body) == RESPONSE


def test_a_replaced_responses_stream_is_the_events_of_one_message(frozen: None) -> None:
    body, _ = replacement("responses", TEXT, MODEL, streamed=True)
    at = {"item_id": f"msg_{HEX}", "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": TEXT, "annotations": []}
    expected: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0,
         "response": {**RESPONSE, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
         "item": {**MESSAGE_ITEM, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", "sequence_number": 2, **at, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", "sequence_number": 3, **at, "delta": TEXT},
        {"type": "response.output_text.done", "sequence_number": 4, **at, "text": TEXT},
        {"type": "response.content_part.done", "sequence_number": 5, **at, "part": part},
        {"type": "response.output_item.done", "sequence_number": 6, "output_index": 0, "item": MESSAGE_ITEM},
        {"type": "response.completed", "sequence_number": 7, "response": RESPONSE},
    ]  # fmt: skip
    assert _sdk_shapes.events(body) == [(event["type"], event) for event in expected]


def test_a_replaced_chat_stream_is_two_chunks_and_done(frozen: None) -> None:
    body, kind = replacement("chat", TEXT, MODEL, streamed=True)
    head = {"id": f"chatcmpl-{HEX}", "object": "chat.completion.chunk", "created": NOW, "model": MODEL}
    assert kind == b"text/event-stream"
    assert _sdk_shapes.events(body) == [
        (None, {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": TEXT},
                                     "finish_reason": None}]}),
        (None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, "[DONE]"),
    ]  # fmt: skip
    completion, chunks = _sdk_shapes.chat_stream(body)
    for chunk in chunks:
        known(chunk, "chunk")
    assert [(choice.index, choice.message.content, choice.finish_reason) for choice in completion.choices] == [
        (0, TEXT, "stop")
    ]


def test_a_replaced_completions_stream_is_one_event_and_done(frozen: None) -> None:
    body, _ = replacement("completions", TEXT, MODEL, streamed=True)
    found = _sdk_shapes.events(body)
    assert found == [
        (None, {"id": f"cmpl-{HEX}", "object": "text_completion", "created": NOW, "model": MODEL,
                "choices": [{"index": 0, "text": TEXT, "finish_reason": "stop", "logprobs": None}]}),
        (None, "[DONE]"),
    ]  # fmt: skip
    known(Completion.model_validate(found[0][1]), "event")


def test_a_replaced_messages_stream_is_anthropics_event_sequence(frozen: None) -> None:
    body, _ = replacement("messages", TEXT, MODEL, streamed=True)
    start: dict[str, Any] = {"id": f"msg_{HEX}", "type": "message", "role": "assistant", "model": MODEL, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
    expected: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 0}},
        {"type": "message_stop"},
    ]  # fmt: skip
    assert _sdk_shapes.events(body) == [(event["type"], event) for event in expected]
    message = _sdk_shapes.messages_stream(body)
    known(message)
    assert (message.model, message.stop_reason, [block.model_dump() for block in message.content]) == (
        MODEL, "end_turn", [{"type": "text", "text": TEXT, "citations": None}]
    )  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_anthropic_sdk_reads_a_replaced_message(frozen: None, stream: bool) -> None:
    body, _ = replacement("messages", TEXT, MODEL, streamed=stream)
    with client_of(anthropic.Anthropic, body, stream=stream) as client:
        asked = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        if stream:
            with client.messages.stream(**asked) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**asked)
    assert isinstance(message, Message) and message.id == f"msg_{HEX}"
    assert [block.text for block in message.content if block.type == "text"] == [TEXT]


# --- a started stream that breaks off ends with the API's error event ---------------------------------------------
def test_a_broken_responses_stream_ends_with_the_sdks_error_event() -> None:
    ending = API_BY_NAME["responses"].stream_error("the upstream broke off its answer")
    with client_of(openai.OpenAI, ending, stream=True) as client:
        events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    assert len(events) == 1 and isinstance(events[0], ResponseErrorEvent)
    known(events[0], "event")
    assert events[0].model_dump() == {
        "type": "error",
        "code": "upstream_error",
        "message": "the upstream broke off its answer",
        "param": None,
        "sequence_number": 0,
    }
    assert ending.startswith(b"event: error\ndata: {") and ending.endswith(b"}\n\n")


def test_a_broken_messages_stream_raises_an_api_error_in_the_anthropic_sdk() -> None:
    ending = API_BY_NAME["messages"].stream_error("the upstream broke off its answer")
    asked = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with client_of(anthropic.Anthropic, ending, stream=True) as client, pytest.raises(anthropic.APIStatusError) as info:
        list(client.messages.create(**asked))
    assert info.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "the upstream broke off its answer"},
    }
    assert ending.endswith(b"}\n\n")


# --- GET /v1/models -------------------------------------------------------------------------------------------------
def test_the_openai_sdk_lists_the_models_each_in_openais_model_shape() -> None:
    listed = API_BY_NAME["chat"].model_list(["auto", "small-model"], NOW)
    assert json.loads(listed)["object"] == "list"
    with client_of(openai.OpenAI, listed) as client:
        page = client.models.list()
    for model in page.data:
        assert isinstance(model, Model)
        known(model, "model")
    assert page.object == "list"
    assert [model.model_dump(exclude_unset=True) for model in page.data] == [
        {"id": name, "object": "model", "created": NOW, "owned_by": "d3-router"} for name in ("auto", "small-model")
    ]


def test_the_anthropic_sdk_lists_the_models_in_anthropics_list_shape() -> None:
    listed = API_BY_NAME["messages"].model_list(["auto", "small-model"], 1_700_000_000)
    assert json.loads(listed) == {
        "data": [{"type": "model", "id": name, "display_name": name, "created_at": "2023-11-14T22:13:20Z"}
                 for name in ("auto", "small-model")],
        "has_more": False, "first_id": "auto", "last_id": "small-model",
    }  # fmt: skip
    with client_of(anthropic.Anthropic, listed) as client:
        page = client.models.list()
    assert [(model.id, model.display_name, model.created_at.isoformat()) for model in page.data] == [
        (name, name, "2023-11-14T22:13:20+00:00") for name in ("auto", "small-model")]  # fmt: skip
    assert json.loads(API_BY_NAME["messages"].model_list([], 0)) == {
        "data": [], "has_more": False, "first_id": None, "last_id": None}  # fmt: skip


# --- completions' text: every choice's, in order; a choice without text adds none ------------------------------------
CHOICES = [{"index": 0, "text": "Hello"}, {"index": 1}, {"index": 2, "text": " world"}]


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_a_json_answer_that_is_not_an_object_reads_as_empty(api: str) -> None:
    assert read_answer(api, b'["not", "an", "answer"]', streamed=False) == Answered()


def test_a_completions_answer_reads_as_its_choices_texts_joined() -> None:
    raw = json.dumps({"object": "text_completion", "choices": CHOICES}).encode()
    assert read_answer("completions", raw, streamed=False).text == "Hello world"


def test_a_completions_stream_reads_as_its_choices_texts_joined() -> None:
    raw = _sdk_shapes.chunks_of({"object": "text_completion", "choices": CHOICES}, {"choices": [{"index": 0}]})
    assert read_answer("completions", raw, streamed=True).text == "Hello world"


# --- Anthropic's answer: its text blocks joined, its tool calls with their input as JSON ------------------------------
BLOCKS = [
    {"type": "text", "text": "Hello"}, {"type": "text"}, {"type": "text", "text": " world"},
    {"type": "server_tool_use", "name": "web_search", "input": {"query": "café"}},
    {"type": "tool_use", "input": {}}, {"type": "tool_use", "name": "f"},
]  # fmt: skip
CALLS = [Call("web_search", '{"query": "café"}'), Call("", "{}"), Call("f", "{}")]


def test_a_messages_answer_reads_as_its_text_and_its_calls_arguments_unescaped() -> None:
    read = read_answer("messages", json.dumps({"type": "message", "content": BLOCKS}).encode(), streamed=False)
    assert (read.text, read.calls) == ("Hello world", CALLS)


def test_a_responses_answer_reads_as_its_messages_text_and_every_kind_of_call() -> None:
    output = [
        {"type": "message", "content": [{"type": "output_text", "text": "Hello"}]},
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": " world"}]},
        {"type": "function_call"},
        {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "local_shell_call", "action": {"command": ["ls"]}},
        {"type": "local_shell_call"},
    ]
    read = read_answer("responses", json.dumps({"object": "response", "output": output}).encode(), streamed=False)
    assert (read.text, read.calls) == ("Hello world", [
        Call("", ""), Call("apply_patch", "*** Begin Patch"), Call("local_shell", '{"command": ["ls"]}'),
        Call("local_shell", "{}"),
    ])  # fmt: skip


def test_a_chat_answer_reads_as_every_choices_text_and_calls() -> None:
    calls = [
        {"type": "function", "function": {"arguments": '{"x": 1}'}},
        {"type": "function", "function": {"name": "f"}},
    ]
    choices = [{"index": 0, "message": {"role": "assistant", "content": "Hello"}},
               {"index": 1, "message": {"role": "assistant", "content": " world", "tool_calls": calls}}]  # fmt: skip
    read = read_answer("chat", json.dumps({"object": "chat.completion", "choices": choices}).encode(), streamed=False)
    assert (read.text, read.calls) == ("Hello world", [Call("", '{"x": 1}'), Call("f", "")])


def test_a_responses_stream_completes_each_call_with_its_item_done() -> None:
    seen, follow = Followed(), FOLLOWERS["responses"]
    shell = {"type": "local_shell_call", "action": {"command": ["ls"]}}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "content": []}},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Hello"},
        {"type": "response.output_text.delta", "output_index": 0},
        {"type": "response.output_text.delta", "output_index": 0, "delta": " world"},
        {"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "content": []}},
        {"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "name": "fetch"}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"path": '},
        {"type": "response.function_call_arguments.delta", "output_index": 1},
        {"type": "response.function_call_arguments.delta", "output_index": 7, "delta": "stray"},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '"a"}'},
        {"type": "response.output_item.added", "output_index": 2, "item": {"type": "custom_tool_call", "name": "patch"}},
        {"type": "response.custom_tool_call_input.delta", "output_index": 2, "delta": "*** Begin"},
        {"type": "response.output_item.added", "output_index": 3, "item": {"type": "local_shell_call"}},
        {"type": "response.output_item.added", "output_index": 4, "item": {"id": "item_4"}},
        {"type": "response.output_item.done", "output_index": 3, "item": shell},
        {"type": "response.output_item.added", "output_index": 5, "item": {"type": "local_shell_call"}},
    ]  # fmt: skip
    for event in events:
        follow(event, seen)
    assert (seen.text, seen.done) == ("Hello world", [Call("local_shell", '{"command": ["ls"]}')])
    assert seen.open == {
        1: ["fetch", '{"path": "a"}'],
        2: ["patch", "*** Begin"],
        4: ["", ""],
        5: ["local_shell_call", ""],
    }, "calls streaming"


def test_a_chat_stream_completes_a_choices_calls_when_that_choice_finishes() -> None:
    seen, follow = Followed(), FOLLOWERS["chat"]

    def chunk(*choices: dict[str, Any]) -> None:
        follow({"object": "chat.completion.chunk", "choices": list(choices)}, seen)

    def calls(*pieces: tuple[int, dict[str, str]]) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, "function": function} for index, function in pieces]}

    chunk(
        {"index": 0, "delta": {"role": "assistant", "content": "Hi"}},
        {"index": 1, "delta": calls((0, {"name": "fe", "arguments": '{"a"'}), (1, {"name": "g"}))},
    )
    chunk(
        {"index": 1, "delta": calls((0, {"name": "tch", "arguments": ": 1}"}))},
        {"index": 0, "delta": {"content": " there", **calls((0, {"name": "h", "arguments": "{}"}))}},
    )
    chunk({"index": 1, "delta": {}, "finish_reason": "tool_calls"})
    assert (seen.text, seen.done, seen.open) == ("Hi there", [Call("fetch", '{"a": 1}'), Call("g", "")],
                                                 {(0, 0): ["h", "{}"]})  # fmt: skip
    chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"})
    assert (seen.done[2:], seen.open) == ([Call("h", "{}")], {})
    chunk({"delta": {"tool_calls": [{"function": {"name": "ls", "arguments": "{"}}]}})  # no index: choice 0, call 0
    chunk({"index": 0, "delta": calls((0, {"arguments": "}"}))})
    chunk({"delta": {}, "finish_reason": "tool_calls"})
    assert (seen.done[3:], seen.open) == ([Call("ls", "{}")], {})


def test_a_messages_stream_completes_each_call_when_its_block_stops() -> None:
    seen, follow = Followed(), FOLLOWERS["messages"]
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": " world"}},
        {"type": "content_block_start", "index": 3, "content_block": {"type": "server_tool_use", "name": "web_search"}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": '{"q": '}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta"}},
        {"type": "content_block_delta", "index": 9, "delta": {"type": "input_json_delta", "partial_json": "stray"}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": '"x"}'}},
        {"type": "content_block_stop", "index": 3},
        {"type": "content_block_start", "index": 4, "content_block": {"type": "tool_use"}},
        {"type": "content_block_stop", "index": 4},
        {"type": "content_block_start", "index": 5, "content_block": {"type": "tool_use", "name": "open"}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
    ]  # fmt: skip
    for event in events:
        follow(event, seen)
    assert (seen.text, seen.done) == ("Hello world", [Call("web_search", '{"q": "x"}'), Call("", "")])
    assert seen.open == {5: ["open", ""]}, "a call still streaming is not complete"


# --- errors keep what they are given; a broken chat stream's error is OpenAI's -------------------------------------
@pytest.mark.parametrize(
    ("error", "status", "fields"),
    [
        (ModelNotFound("no such model", status=410), 410, ("no such model", "model_not_found", "model")),
        (Unauthorized("no key", param="x-api-key", status=407), 407, ("no key", "invalid_api_key", "x-api-key")),
        (RateLimited("over the rate", 7), 429, ("over the rate", "rate_limit_exceeded", None)),
    ],
)
def test_an_error_answers_with_its_own_message_param_and_status(
    error: RequestError, status: int, fields: tuple[str, str, str | None]
) -> None:
    answered, body, _ = answer(error, API_BY_NAME["chat"])
    found = json.loads(body)["error"]
    assert (answered, (found["message"], found["code"], found["param"])) == (status, fields)


def test_a_broken_chat_stream_raises_the_upstream_error_in_the_openai_sdk() -> None:
    ending = API_BY_NAME["chat"].stream_error("the upstream broke off its answer")
    with client_of(openai.OpenAI, ending, stream=True) as client, pytest.raises(openai.APIError) as info:
        list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True))
    assert (info.value.message, info.value.type) == ("the upstream broke off its answer", "upstream_error")


# --- the usage a stream's events carry -------------------------------------------------------------------------------
def data(event: dict[str, Any], name: str | None = None) -> bytes:
    return (f"event: {name}\n" if name else "").encode() + b"data: " + json.dumps(event).encode() + b"\n\n"


USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
ANSWERED = {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}


@pytest.mark.parametrize("asked", [False, True], ids=["client-asked", "router-asked"])
def test_a_chunk_with_content_and_usage_reaches_the_client_and_is_counted(asked: bool) -> None:
    reader = UsageReader("chat", asked=asked)  # servers that report usage on every chunk (vLLM's continuous stats)
    assert reader.event(data({"object": "chat.completion.chunk", "choices": [ANSWERED], "usage": USAGE})) is True
    assert reader.tokens == Tokens(input=11, output=7, reported=True)


def test_a_chunk_without_choices_whose_usage_is_null_is_not_the_usage_chunk() -> None:
    reader = UsageReader("chat", asked=True)  # e.g. a prompt-filter chunk: it reaches the client
    assert reader.event(data({"object": "chat.completion.chunk", "choices": [], "usage": None})) is True
    assert reader.tokens == Tokens()


def test_the_usage_chunk_is_cut_only_when_the_router_asked_for_it() -> None:
    chunk = data({"object": "chat.completion.chunk", "choices": [], "usage": USAGE})
    assert [UsageReader("chat", asked=asked).event(chunk) for asked in (False, True)] == [True, False]


def test_an_event_holding_usage_that_is_not_json_passes_unread() -> None:
    reader = UsageReader("chat", asked=True)
    assert reader.event(b'data: {"usage": truncated\n\n') is True
    assert reader.tokens == Tokens()


@pytest.mark.parametrize("ending", ["response.completed", "response.incomplete", "response.failed"])
def test_a_responses_stream_is_counted_from_its_last_event_which_is_never_cut(ending: str) -> None:
    reader = UsageReader("responses", asked=True)
    usage = {"input_tokens": 20, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 8}}
    assert reader.event(data({"type": ending, "response": {"usage": usage}}, ending)) is True
    assert reader.tokens == Tokens(input=20, cached=8, output=5, reported=True)


def test_a_messages_stream_is_counted_from_its_events_which_are_never_cut() -> None:
    reader = UsageReader("messages", asked=True)
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}
    assert [reader.event(data(start, "message_start")), reader.event(data(delta, "message_delta"))] == [True, True]
    assert reader.tokens == Tokens(input=9, output=6, reported=True)


def test_anthropic_usage_counts_the_cache_reads_and_reports_only_what_it_found() -> None:
    reader = UsageReader("messages")
    reader.event(data({"type": "message_delta", "delta": {}, "usage": {}}, "message_delta"))
    assert reader.tokens == Tokens(), "no token count in it: nothing reported"
    start = {"usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "cache_creation_input_tokens": 1}}
    reader.event(data({"type": "message_start", "message": start}, "message_start"))
    assert reader.tokens == Tokens(input=8, cached=2, output=0, reported=True)


# --- the shape of the errors of a path that is not a decided endpoint ------------------------------------------------
VERSION = [(b"anthropic-version", b"2023-06-01")]


@pytest.mark.parametrize(
    ("path", "headers", "api"),
    [
        ("/v1/responses", VERSION, "responses"),
        ("/v1/messages/count_tokens", [], "messages"),
        ("/v1/models", VERSION, "messages"),
        ("/v1/models", [], "chat"),
        ("/v1/embeddings", VERSION, "chat"),
    ],
)
def test_errors_take_the_shape_of_the_api_the_path_belongs_to(path: str, headers: list[tuple[bytes, bytes]], api: str
                                                              ) -> None:  # fmt: skip
    assert error_api(path, headers) is API_BY_NAME[api]


# --- the request's facts --------------------------------------------------------------------------------------------
def video(name: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": f"https://img.example.com/{name}.mp4"}}


def test_each_video_of_a_request_is_counted_once() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://img.example.com/a.png"}}
    content = [{"type": "text", "text": "Compare"}, video("a"), image, video("b")]
    body = {"model": "auto", "messages": [{"role": "user", "content": content}]}
    chat = API_BY_NAME["chat"]
    facts = request_facts(chat, body, chat.state(body, StateSettings("last_user", 100), DEFAULT_MEDIA))
    assert (facts["request.videos"], facts["request.images"]) == (2, 1)


def test_a_media_url_two_parsers_read_differently_is_refused_naming_the_messages() -> None:
    with pytest.raises(BadRequest) as info:
        extract_state([user_with("http://169.254.169.254\\@img.example.com/a.png")], StateSettings("last_user", 100))
    assert (info.value.message, info.value.param, info.value.status) == (
        "a media URL holds userinfo, a backslash, a space, a non-ASCII character or a host URL parsers read "
        "differently; send a plain http(s)://host/path URL or a data URL", "messages", 400,
    )  # fmt: skip


def test_a_media_url_by_ipv6_address_is_read_as_its_host() -> None:
    state = extract_state([user_with("http://[::1]/a.png")], StateSettings("last_user", 100))
    assert state.dropped == ("host ::1 not in server.media_hosts",)


def user_with(url: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}],
    }


def test_the_token_estimate_of_a_text_alone_counts_no_turn() -> None:
    text = "Hello world, this is a test of the tokenizer."  # the docstring's example
    assert estimate_tokens(text) == estimate_tokens(text, 0) == 12


# --- `state: {from: new}`: what is new since the assistant last spoke ------------------------------------------------
def said(role: str, text: str = "", *calls: str) -> Turn:
    return Turn(role, text, (), tuple(calls))


def acting(*calls: str) -> Turn:
    """The turn `from: new` opens with: the last assistant turn's tool calls, without its words."""
    return Turn("assistant", "", (), calls)


NEW = {
    # Responses: a message, then parallel calls as several items; what follows, but the system prompts
    "parallel-calls": (
        [said("system", "s"), said("user", "task"), said("assistant", "I will look", "c0"), said("assistant", "", "c1"),
         said("assistant", "", "c2"), said("tool", "out"), said("developer", "d"), said("system", "s2"),
         said("user", "more")],
        [acting("c1", "c2"), said("tool", "out"), said("user", "more")],
    ),
    "calls-opening-the-request": (
        [said("assistant", "", "c0"), said("assistant", "", "c1")], [acting("c0", "c1")]
    ),
    "after-the-users-task": (
        [said("user", "task"), said("assistant", "", "c0"), said("assistant", "", "c1")], [acting("c0", "c1")]
    ),
    "the-first-turn-is-the-assistants": ([said("assistant", "Let me look", "c0"), said("tool", "out")],
                                         [acting("c0"), said("tool", "out")]),
    "only-the-assistants-calls": ([said("assistant", "", "c0"), said("user", "", "cu")],  # tool_use in a user turn
                                  [acting("c0"), said("user", "", "cu")]),
    "an-answer-without-calls": ([said("user", "q"), said("assistant", "a"), said("user", "next")], [said("user", "next")]),
    "no-assistant-from-the-first-turn": ([said("user", "first"), said("tool", "r")], [said("user", "first"), said("tool", "r")]),
    "no-assistant-yet": ([said("system", "s"), said("user", "first")], [said("user", "first")]),
    "nothing-new": ([said("system", "s"), said("user", "q"), said("assistant", "a")], [said("assistant", "a")]),
}  # fmt: skip


@pytest.mark.parametrize(("turns", "expected"), list(NEW.values()), ids=list(NEW))
def test_new_reads_the_last_calls_and_what_came_after(turns: list[Turn], expected: list[Turn]) -> None:
    assert since_assistant(turns) == expected
