"""Property tests over generated conversations and answers (issue 30): Messages -> chat -> Messages keeps every field
chat can hold and names each one it cannot; a chat answer -> Messages -> chat keeps its text, tool calls, finish
reason and usage; a chat stream cut anywhere translates to the events of the whole answer. Every translated body is
checked by the SDKs' own types."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from router._translate.chat_messages import ChatOverMessages
from router._translate.messages_chat import MessagesOverChat
from router._translate.registry import Composed
from tests.router import _sdk_shapes as sdk

FAST = settings(max_examples=60, deadline=None)
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)
names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
inputs = st.dictionaries(names, st.one_of(st.integers(-9, 9), words, st.booleans()), max_size=3)
cache = st.sampled_from([None, {"type": "ephemeral"}])
image = st.builds(lambda data: {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                             "data": data}},
                  st.from_regex(r"[A-Za-z0-9+/]{4,16}", fullmatch=True))  # fmt: skip


def _text(text: str, control: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": control} if control else {})}


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    """Alternating turns, each assistant turn optionally thinking and calling tools, each call answered by a
    tool_result first in the next user turn (as Anthropic requires)."""
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for turn in range(draw(st.integers(1, 3))):
        results = [{"type": "tool_result", "tool_use_id": call, "content": draw(words),
                    **({"is_error": True} if draw(st.booleans()) and turn else {})} for call in pending]  # fmt: skip
        own = draw(st.lists(st.one_of(st.builds(_text, words, cache), image), min_size=0 if results else 1,
                            max_size=3))  # fmt: skip
        messages.append({"role": "user", "content": [*results, *own]})
        if turn == 2:
            break
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(words), "signature": draw(words)})
        blocks.append(_text(draw(words), None))
        pending = [f"toolu_{turn}_{n}" for n in range(draw(st.integers(0, 2)))]
        blocks += [{"type": "tool_use", "id": call, "name": draw(names), "input": draw(inputs)} for call in pending]
        messages.append({"role": "assistant", "content": blocks})
    body: dict[str, Any] = {"model": "m", "max_tokens": draw(st.integers(1, 4096)), "messages": messages}
    if draw(st.booleans()):
        body["system"] = draw(words)
    if draw(st.booleans()):
        body["stop_sequences"] = draw(st.lists(words, min_size=1, max_size=3))
    if draw(st.booleans()):
        body["tools"] = [{"name": draw(names), "description": draw(words), "input_schema": {"type": "object"}}]
    if draw(st.booleans()):
        body["metadata"] = {"user_id": draw(words)}
    if draw(st.booleans()):
        body["top_k"] = draw(st.integers(1, 50))
    return body


def _kept(body: dict[str, Any]) -> list[Any]:
    """What chat can hold of a conversation, turn by turn: texts, images, tool calls and results with their ids."""
    out: list[Any] = []
    for message in body["messages"]:
        blocks = message["content"]
        out.append((
            message["role"],
            "\n".join(b["text"] for b in blocks if b["type"] == "text"),
            [b["source"]["data"] for b in blocks if b["type"] == "image"],
            [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"],
            [(b["tool_use_id"], json.dumps(b["content"]) if not isinstance(b["content"], str) else b["content"])
             for b in blocks if b["type"] == "tool_result"],
        ))  # fmt: skip
    return out


def _flat(back: dict[str, Any]) -> dict[str, Any]:
    """The round trip's tool results with their text as one string (chat's tool message holds a string)."""
    for message in back["messages"]:
        for block in message["content"]:
            if block["type"] == "tool_result":
                block["content"] = "\n".join(part["text"] for part in block["content"])
    return back


def _expected_losses(body: dict[str, Any]) -> set[str]:
    blocks = [b for m in body["messages"] for b in m["content"]]
    lost = set()
    if any(b["type"] == "thinking" for b in blocks):
        lost |= {"thinking_dropped", "thinking_signature_dropped"}
    if any(b.get("cache_control") for b in blocks):
        lost.add("cache_control_dropped")
    if any(b.get("is_error") for b in blocks):
        lost.add("tool_result_is_error_dropped")
    if "top_k" in body:
        lost.add("top_k_dropped")
    return lost


@FAST
@given(conversations())
def test_there_and_back_keeps_what_chat_holds_and_names_the_rest(body: dict[str, Any]) -> None:
    there, lost = MessagesOverChat().request(body)
    sdk.chat_request(there)
    back, _ = ChatOverMessages().request(there)
    sdk.messages_request(back)
    assert _kept(_flat(back)) == _kept(body)
    assert back["max_tokens"] == body["max_tokens"]
    assert back.get("stop_sequences") == body.get("stop_sequences")
    assert back.get("metadata") == body.get("metadata")
    assert [t["name"] for t in back.get("tools", [])] == [t["name"] for t in body.get("tools", [])]
    assert "".join(b["text"] for b in back.get("system", [])) == body.get("system", "")
    assert set(lost) == _expected_losses(body)
    # Composed, the same round trip in one translation.
    assert Composed(MessagesOverChat(), ChatOverMessages()).request(body)[1][: len(lost)] == lost


FINISHES = ["stop", "length", "tool_calls", "content_filter"]


@st.composite
def chat_answers(draw: st.DrawFn) -> dict[str, Any]:
    calls = [{"id": f"call_{n}", "type": "function",
              "function": {"name": draw(names), "arguments": json.dumps(draw(inputs))}}
             for n in range(draw(st.integers(0, 2)))]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), words))}
    if calls:
        message["tool_calls"] = calls
    if draw(st.booleans()):
        message["reasoning_content"] = draw(words)
    finish = "tool_calls" if calls else draw(st.sampled_from([f for f in FINISHES if f != "tool_calls"]))
    prompt, completion = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**4))
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}  # fmt: skip


@FAST
@given(chat_answers())
def test_an_answer_there_and_back_keeps_its_text_calls_reason_and_usage(answer: dict[str, Any]) -> None:
    message, lost = MessagesOverChat().answer(answer)
    sdk.message(message)
    back, more = ChatOverMessages().answer(message)
    completion = sdk.completion(back)
    assert lost == more == []
    original = answer["choices"][0]
    choice = completion.choices[0]
    assert (choice.message.content or None) == (original["message"]["content"] or None)
    assert choice.finish_reason == original["finish_reason"]
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []
            if c.type == "function"] == [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in original["message"].get("tool_calls", [])]  # fmt: skip
    assert back["choices"][0]["message"].get("reasoning_content") == original["message"].get("reasoning_content")
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])  # fmt: skip


def _chunks(answer: dict[str, Any], cuts: list[int]) -> bytes:
    """The answer as a chat stream, its text and each call's arguments cut at `cuts`."""
    message, finish = answer["choices"][0]["message"], answer["choices"][0]["finish_reason"]

    def chunk(delta: dict[str, Any], end: str | None = None) -> dict[str, Any]:
        return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": end}]}  # fmt: skip

    def cut(text: str) -> list[str]:
        points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
        return [text[a:b] for a, b in itertools.pairwise(points) if text[a:b]]

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": piece}) for piece in cut(message.get("reasoning_content") or "")]
    out += [chunk({"content": piece}) for piece in cut(message.get("content") or "")]
    for index, call in enumerate(message.get("tool_calls", [])):
        out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": ""}}]}))  # fmt: skip
        out += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in cut(call["function"]["arguments"])]  # fmt: skip
    out.append(chunk({}, finish))
    out.append({**chunk({}), "choices": [], "usage": answer["usage"]})
    return sdk.chunks_of(*out)


@FAST
@given(chat_answers(), st.lists(st.integers(0, 200), max_size=4), st.integers(1, 64))
def test_a_stream_cut_anywhere_is_the_whole_answer(answer: dict[str, Any], cuts: list[int], size: int) -> None:
    whole = sdk.message(MessagesOverChat().answer(answer)[0])
    stream = MessagesOverChat().stream()
    out = b"".join(stream.feed(piece) for piece in sdk.pieces(_chunks(answer, cuts), size)) + stream.flush()
    streamed = sdk.messages_stream(out)
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in whole.content]  # fmt: skip
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), words),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["type", "role", "content", "text", "id", "name", "input", "source", "tool_use_id", "function", "arguments",
         "tool_calls", "messages", "system", "tools", "choices", "message", "delta", "usage", "index",
         "content_block", "partial_json", "finish_reason", "reasoning_content", "image_url", "url", "tool_call_id"]), inner,
        max_size=4)),
    max_leaves=12,
)  # fmt: skip


@FAST
@given(st.dictionaries(st.sampled_from(["model", "messages", "system", "tools", "tool_choice", "stop", "stop_sequences",
                                        "metadata", "thinking", "output_config", "response_format", "max_tokens",
                                        "reasoning_effort", "stream", "stream_options", "content", "choices",
                                        "usage", "id", "stop_reason"]), json_values, max_size=6))  # fmt: skip
def test_no_body_makes_a_translation_raise(body: dict[str, Any]) -> None:
    """A policy reading leniently lets odd parts through: whatever the body, each translation makes a body."""
    for tr in (MessagesOverChat(), ChatOverMessages()):
        tr.request(body)
        tr.answer(body)
        stream = tr.stream()
        stream.feed(b"data: " + json.dumps(body).encode() + b"\n\n")
        stream.feed(b"event: message_start\ndata: " + json.dumps(body).encode() + b"\n\n")
        stream.flush()
