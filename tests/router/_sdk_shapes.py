"""Checking translated bodies with the SDKs' own types: requests against their params (TypedDicts, validated by
pydantic; their lazy iterables drained so that each item is checked), answers against their response models,
streams through the SDKs' own accumulators."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pydantic
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

from router._translate.base import SseReader

_CHAT_PARAMS = pydantic.TypeAdapter(CompletionCreateParamsNonStreaming)
_MESSAGES_PARAMS = pydantic.TypeAdapter(MessageCreateParamsNonStreaming)
_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def _checked(original: Any, validated: Any, where: str = "body") -> Any:
    """A validated TypedDict with its lazy iterables (each item validated as it is read) read out; a key the SDK's
    type does not know (pydantic ignores it) is an error: the SDK would not send it, the API may refuse it."""
    if isinstance(validated, dict):
        unknown = sorted(set(original) - set(validated)) if isinstance(original, dict) else []
        if unknown:
            raise AssertionError(f"{where} has keys the SDK's type does not know: {unknown}")
        return {key: _checked(original[key], item, f"{where}.{key}") for key, item in validated.items()}
    if isinstance(validated, (str, bytes, int, float, bool)) or validated is None:
        return validated
    if isinstance(validated, Iterable):
        items = list(validated)
        return [
            _checked(orig, item, f"{where}[{n}]") for n, (orig, item) in enumerate(zip(original, items, strict=True))
        ]
    return validated


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as the openai SDK's chat request params accept it (ValidationError otherwise)."""
    plain = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
    return dict(_checked(plain, _CHAT_PARAMS.validate_python(plain)))


def messages_request(body: dict[str, Any]) -> dict[str, Any]:
    plain = {key: value for key, value in body.items() if key != "stream"}
    return dict(_checked(plain, _MESSAGES_PARAMS.validate_python(plain)))


def message(body: dict[str, Any]) -> Message:
    return Message.model_validate(body)


def completion(body: dict[str, Any]) -> ChatCompletion:
    return ChatCompletion.model_validate(body)


def events(data: bytes) -> list[tuple[str | None, Any]]:
    """An event stream's events as (name, parsed data), `[DONE]` as (None, "[DONE]")."""
    reader = SseReader()
    found = [(event.event, event.json() if event.data != "[DONE]" else "[DONE]") for event in reader.feed(data)]
    return found + [(event.event, event.json()) for event in reader.flush()]


def messages_stream(data: bytes) -> Message:
    """A Messages event stream accumulated as the anthropic SDK does (each event validated, names matching)."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, payload in events(data):
        event = _EVENT.validate_python(payload)
        if name != event.type:
            raise AssertionError(f"event {name!r} carries {event.type!r}")
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    if snapshot is None:
        raise AssertionError("no event")
    return Message.model_validate(snapshot.model_dump())


def chat_stream(data: bytes) -> tuple[ChatCompletion, list[ChatCompletionChunk]]:
    """A chat stream accumulated by the openai SDK's stream state; it must end with `[DONE]`."""
    state = ChatCompletionStreamState()
    chunks = []
    found = events(data)
    if not found or found[-1][1] != "[DONE]":
        raise AssertionError("the stream does not end with [DONE]")
    for _, payload in found[:-1]:
        chunk = ChatCompletionChunk.model_validate(payload)
        chunks.append(chunk)
        state.handle_chunk(chunk)
    return ChatCompletion.model_validate(state.get_final_completion().model_dump()), chunks


def pieces(data: bytes, size: int) -> list[bytes]:
    """`data` cut every `size` bytes (events cut anywhere, as a network does)."""
    return [data[index : index + size] for index in range(0, len(data), size)]


def chunks_of(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
