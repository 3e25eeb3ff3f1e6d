"""Property tests of the Responses <-> chat pair (issue 30, done-when): over generated conversations, translating
there and back keeps every field the target API can hold, and names each one it cannot; a stream translated there
and back (split anywhere) tells the same answer, every event valid for the `openai` SDK."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

from router._translate.base import SseReader
from router._translate.responses_chat import ChatOverResponses, ResponsesOverChat
from tests.router import _sdk_shapes as sdk

_RESPONSES_PARAMS = TypeAdapter(ResponseCreateParamsNonStreaming)


def responses_request(body: Body) -> None:
    """`body` as the openai SDK's Responses request params accept it, with no key its types do not know."""
    plain = {key: value for key, value in body.items() if key != "stream"}
    sdk._checked(plain, _RESPONSES_PARAMS.validate_python(plain))


EVENT = TypeAdapter(ResponseStreamEvent)
Body = dict[str, Any]

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12)
names = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
call_ids = st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True)
arguments = st.dictionaries(names, st.integers() | text, max_size=3).map(json.dumps)
urls = st.sampled_from(["https://x.test/a.png", "data:image/png;base64,AAAA"])
details = st.sampled_from([None, "low", "high", "auto"])
params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "parallel_tool_calls": st.booleans(),
        "metadata": st.dictionaries(names, text, max_size=2),
        "user": text,
    },
)


def _image(url: str, detail: str | None) -> Body:
    part: Body = {"type": "input_image", "image_url": url}
    return part if detail is None else {**part, "detail": detail}


responses_parts = st.lists(
    st.builds(lambda t: {"type": "input_text", "text": t}, text) | st.builds(_image, urls, details),
    min_size=1,
    max_size=3,
)
responses_items = st.one_of(
    st.builds(
        lambda r, c: {"type": "message", "role": r, "content": c},
        st.sampled_from(["user", "system", "developer"]),
        text | responses_parts,
    ),
    st.builds(
        lambda c: {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []} for t in c],
        },
        st.lists(text, min_size=1, max_size=2),
    ),
    st.builds(
        lambda i, n, a: {"type": "function_call", "call_id": i, "name": n, "arguments": a}, call_ids, names, arguments
    ),
    st.builds(lambda i, o: {"type": "function_call_output", "call_id": i, "output": o}, call_ids, text),
    st.builds(
        lambda s: {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": s}],
            "encrypted_content": "SECRET",
        },
        text,
    ),
)
function_tools = st.builds(
    lambda n, d, s: {"type": "function", "name": n, "description": d, "parameters": {"type": "object"}, "strict": s},
    names,
    text,
    st.booleans(),
)


@st.composite
def responses_requests(draw: st.DrawFn) -> Body:
    body: Body = {"model": "auto", "input": draw(st.lists(responses_items, min_size=1, max_size=6)), **draw(params)}
    if draw(st.booleans()):
        body["instructions"] = draw(text)
    tools = draw(st.lists(function_tools, max_size=2, unique_by=lambda tool: tool["name"]))
    if draw(st.booleans()):
        tools.append({"type": "web_search"})
    if tools:
        body["tools"] = tools
        functions = [tool["name"] for tool in tools if tool["type"] == "function"]
        choices = ["auto", "required", "none", *({"type": "function", "name": name} for name in functions)]
        body["tool_choice"] = draw(st.sampled_from(choices))
    for key, value in draw(
        st.fixed_dictionaries(
            {},
            optional={
                "max_output_tokens": st.integers(1, 4096),
                "reasoning": st.builds(lambda e: {"effort": e}, st.sampled_from(["minimal", "low", "medium", "high"])),
                "store": st.booleans(),
                "text": st.just(
                    {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}}
                ),
            },
        )
    ).items():
        body[key] = value
    return body


def _responses_view(body: Body) -> Body:
    """What a Responses request says that chat can hold: instructions as the leading system turn, developer as
    system, item ids and statuses (bookkeeping) and reasoning items (named) left out."""
    turns: list[Any] = [("system", body["instructions"])] if "instructions" in body else []
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "message" and item["role"] == "assistant":
            content = item["content"]
            turns.append(("assistant", content if isinstance(content, str) else "".join(p["text"] for p in content)))
        elif kind == "message":
            content = item["content"]
            if item["role"] != "user" and not isinstance(content, str):  # chat's system messages hold text only
                content = [part for part in content if part["type"] == "input_text"]
            if not isinstance(content, str):
                content = [(p["type"], p.get("text"), p.get("image_url"), p.get("detail") or "auto") for p in content]
            turns.append(("system" if item["role"] == "developer" else item["role"], content))
        elif kind == "function_call":
            turns.append((kind, item["call_id"], item["name"], item["arguments"]))
        elif kind == "function_call_output":
            turns.append((kind, item["call_id"], item["output"]))
    tools = [tool for tool in body.get("tools", ()) if tool["type"] == "function"]
    view = {
        key: body[key]
        for key in (
            "model",
            "temperature",
            "top_p",
            "parallel_tool_calls",
            "metadata",
            "user",
            "max_output_tokens",
            "reasoning",
            "text",
        )
        if key in body
    }
    if tools:
        view["tools"] = tools
        view["tool_choice"] = body.get("tool_choice")
    return {**view, "turns": turns}


@settings(max_examples=150, deadline=None)
@given(responses_requests())
def test_responses_to_chat_and_back_keeps_what_chat_holds(body: Body) -> None:
    chat, lost = ResponsesOverChat().request(body)
    back, more = ChatOverResponses().request(chat)
    sdk.chat_request(chat)
    responses_request(back)
    assert "SECRET" not in json.dumps(chat)
    assert _responses_view(back) == _responses_view(body)
    expected = set()
    if any(item.get("type") == "reasoning" for item in body["input"]):
        expected.add("reasoning_item_dropped")
    if {"type": "web_search"} in body.get("tools", ()):
        expected.add("web_search_tool_dropped")
        functions = [tool for tool in body["tools"] if tool["type"] == "function"]
        if not functions and body["tool_choice"] not in ("auto", "none"):
            expected.add("tool_choice_dropped")
    if body.get("store"):
        expected.add("store_dropped")
    if any(
        item.get("role") in ("system", "developer")
        and not isinstance(item["content"], str)
        and any(part["type"] == "input_image" for part in item["content"])
        for item in body["input"]
    ):
        expected.add("system_input_image_dropped")
    assert set(lost) == expected and more == []


chat_parts = st.lists(
    st.builds(lambda t: {"type": "text", "text": t}, text)
    | st.builds(
        lambda u, d: {"type": "image_url", "image_url": {"url": u} if d is None else {"url": u, "detail": d}},
        urls,
        details,
    ),
    min_size=1,
    max_size=3,
)
chat_calls = st.lists(
    st.builds(
        lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
        call_ids,
        names,
        arguments,
    ),
    min_size=1,
    max_size=2,
)
chat_messages = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, text | chat_parts),
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["system", "developer"]), text),
    st.builds(lambda c: {"role": "assistant", "content": c}, text),
    st.builds(lambda c, t: {"role": "assistant", "content": c, "tool_calls": t}, st.none() | text, chat_calls),
    st.builds(lambda i, c: {"role": "tool", "tool_call_id": i, "content": c}, call_ids, text),
)
UNHELD = {"stop": ["\n"], "seed": 7, "presence_penalty": 0.5, "frequency_penalty": 0.5, "n": 2, "logit_bias": {"1": 1}}


@st.composite
def chat_requests(draw: st.DrawFn) -> Body:
    messages = draw(st.lists(chat_messages, min_size=1, max_size=6))
    if draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": draw(text)})
    body: Body = {"model": "auto", "messages": messages, **draw(params)}
    tools = draw(
        st.lists(
            st.builds(
                lambda n, s: {"type": "function", "function": {"name": n, "parameters": {}, **s}},
                names,
                st.sampled_from([{}, {"strict": True}, {"strict": False}]),
            ),
            max_size=2,
            unique_by=lambda tool: tool["function"]["name"],
        )
    )
    if tools:
        body["tools"] = tools
        body["tool_choice"] = draw(
            st.sampled_from(
                ["auto", "required", "none", {"type": "function", "function": {"name": tools[0]["function"]["name"]}}]
            )
        )
    limit = draw(st.sampled_from([None, "max_tokens", "max_completion_tokens"]))
    if limit:
        body[limit] = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        body["reasoning_effort"] = draw(st.sampled_from(["low", "medium", "high"]))
    if draw(st.booleans()):
        body["response_format"] = draw(
            st.sampled_from(
                [
                    {"type": "json_object"},
                    {
                        "type": "json_schema",
                        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
                    },
                ]
            )
        )
    for key in draw(st.lists(st.sampled_from(sorted(UNHELD)), unique=True, max_size=3)):
        body[key] = UNHELD[key]
    return body


def _chat_view(body: Body) -> Body:
    """What a chat request says that the Responses API can hold: its turns as a flat list (Responses items keep no
    grouping of tool calls into assistant messages), developer as system, max_tokens as max_completion_tokens."""
    turns: list[Any] = []
    for message in body["messages"]:
        role, content = message["role"], message.get("content")
        if role == "assistant":
            if content:
                turns.append(("assistant", content))
            turns.extend(
                ("call", c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in message.get("tool_calls") or ()
            )
        elif role == "tool":
            turns.append(("tool", message["tool_call_id"], content))
        else:
            if not isinstance(content, str):
                content = [
                    (
                        p["type"],
                        p.get("text"),
                        p.get("image_url", {}).get("url"),
                        p.get("image_url", {}).get("detail") or "auto",
                    )
                    for p in content
                ]
            turns.append(("system" if role == "developer" else role, content))
    view = {
        key: body[key]
        for key in (
            "model",
            "temperature",
            "top_p",
            "parallel_tool_calls",
            "metadata",
            "user",
            "reasoning_effort",
            "response_format",
            "tool_choice",
        )
        if key in body
    }
    view["tools"] = [
        {**tool["function"], "strict": tool["function"].get("strict", False)} for tool in body.get("tools", ())
    ]
    view["max"] = body.get("max_completion_tokens", body.get("max_tokens"))
    return {**view, "turns": turns}


@settings(max_examples=150, deadline=None)
@given(chat_requests())
def test_chat_to_responses_and_back_keeps_what_responses_holds(body: Body) -> None:
    there, lost = ChatOverResponses().request(body)
    back, more = ResponsesOverChat().request(there)
    responses_request(there)
    sdk.chat_request(back)
    assert _chat_view(back) == _chat_view(body)
    assert set(lost) == {f"{key}_dropped" for key in UNHELD if key in body} and more == []


usage = st.builds(
    lambda p, c, k, r: {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": k, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": r},
    },
    st.integers(0, 999),
    st.integers(0, 999),
    st.integers(0, 9),
    st.integers(0, 9),
)


@st.composite
def completions(draw: st.DrawFn) -> Body:
    calls = draw(st.none() | chat_calls)
    content = draw(text) if not calls or draw(st.booleans()) else None
    message: Body = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if draw(st.booleans()):
        message["reasoning_content"] = draw(text)
    finish = draw(st.sampled_from(["length", *(["tool_calls"] if calls else ["stop", "content_filter"])]))
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "up",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": draw(usage),
    }


def _answer_view(body: Body) -> Body:
    choice = body["choices"][0]
    message = {key: value for key, value in choice["message"].items() if value is not None}
    return {"message": message, "finish": choice["finish_reason"], "usage": body["usage"], "model": body["model"]}


@settings(max_examples=150, deadline=None)
@given(completions())
def test_a_chat_answer_there_and_back(answer: Body) -> None:
    response, lost = ResponsesOverChat().answer(answer)
    Response.model_validate(response)
    back, more = ChatOverResponses().answer(response)
    ChatCompletion.model_validate(back)
    assert _answer_view(back) == _answer_view(answer) and lost == more == []


def _chunks(answer: Body, cuts: list[int]) -> list[Body]:
    """A chat answer as the chunks a chat server streams: text and arguments cut at `cuts`, usage last."""
    message = answer["choices"][0]["message"]
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1700000000, "model": "up"}

    def one(delta: Body, finish: str | None = None) -> Body:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def pieces(value: str) -> list[str]:
        bounds = sorted({0, len(value), *(cut % (len(value) + 1) for cut in cuts)})
        return [value[a:b] for a, b in pairwise(bounds)] or [""]

    out = [one({"role": "assistant", "content": ""})]
    out += [one({"reasoning_content": piece}) for piece in pieces(message.get("reasoning_content") or "") if piece]
    out += [one({"content": piece}) for piece in pieces(message.get("content") or "") if piece]
    for index, call in enumerate(message.get("tool_calls") or ()):
        out.append(
            one(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        out += [
            one({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces(call["function"]["arguments"])
            if piece
        ]
    out.append(one({}, answer["choices"][0]["finish_reason"]))
    return [*out, {**head, "choices": [], "usage": answer["usage"]}]


def _feed(stream: Any, raw: bytes, cuts: list[int]) -> bytes:
    bounds = sorted({0, len(raw), *(cut % (len(raw) + 1) for cut in cuts)})
    return b"".join(stream.feed(raw[a:b]) for a, b in pairwise(bounds)) + stream.flush()


@settings(max_examples=100, deadline=None)
@given(completions(), st.lists(st.integers(0, 10_000), max_size=6))
def test_a_chat_stream_there_and_back(answer: Body, cuts: list[int]) -> None:
    upstream = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in _chunks(answer, cuts)) + b"data: [DONE]\n\n"
    tr = ResponsesOverChat()
    tr.request({"model": "auto", "input": "hi", "stream": True})
    events = _feed(tr.stream(), upstream, cuts)
    reader = SseReader()
    seen = [EVENT.validate_python(event.json()) for event in reader.feed(events)]
    assert [event.sequence_number for event in seen] == list(range(len(seen)))
    final = seen[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert _answer_view(ChatOverResponses().answer(final.response.model_dump())[0]) == _answer_view(answer)
    back = ChatOverResponses()
    back.request({"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}})
    chunks = [event.json() for event in SseReader().feed(_feed(back.stream(), events, cuts))]
    assert chunks[-1] is None  # [DONE]
    valid = [ChatCompletionChunk.model_validate(chunk) for chunk in chunks[:-1]]
    deltas = [chunk.choices[0].delta for chunk in valid if chunk.choices]
    message = answer["choices"][0]["message"]
    assert "".join(delta.content or "" for delta in deltas) == (message["content"] or "")
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.tool_calls or ():
            calls.setdefault(call.index, []).append((call.function.arguments or "") if call.function else "")
    assert ["".join(parts) for parts in calls.values()] == [
        c["function"]["arguments"] for c in message.get("tool_calls") or ()
    ]
    finishes = [chunk.choices[0].finish_reason for chunk in valid if chunk.choices]
    assert finishes[-1] == answer["choices"][0]["finish_reason"]
    assert valid[-1].usage is not None and valid[-1].usage.model_dump(exclude_none=True) == {
        **answer["usage"],
        "prompt_tokens_details": {
            "cached_tokens": answer["usage"]["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
    }
