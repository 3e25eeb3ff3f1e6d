"""What the canned upstream (benchmarks/_upstream.py) answers in each client API, and what the load generator asks.

`ANSWERS[path suffix]` is (the plain JSON body, the stream's chunks) for chat, the Responses API and the
Anthropic Messages API, in the shapes and SSE event formats vLLM writes. Every stream is 6 chunks, as chat's is
(5 deltas, then [DONE]): the Responses stream's opening events (`response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`) go in the first chunk with the first delta, its
closing ones (`response.output_text.done` ... `response.completed`) in the sixth; likewise `message_start` and
`content_block_start` before the first `content_block_delta`, and `content_block_stop`, `message_delta`,
`message_stop` in the sixth. The text is the same, `t0t1t2t3t4` streamed or `ok` plain.

`request(api, stream)` is the body the load generator sends to each API: the same one user turn.
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks._loadgen import PROMPT

DELTAS = [f"t{i}" for i in range(5)]
ID = "bench0123456789abcdef"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), _dumps(data))


# --- chat -------------------------------------------------------------------------------------------------------
CHAT = _dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
})  # fmt: skip
CHAT_CHUNKS = [
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % d.encode()
    for d in DELTAS
] + [b"data: [DONE]\n\n"]
# The usage chunk, sent before [DONE] only to a stream that asks (`stream_options.include_usage`), as vLLM does.
CHAT_USAGE_CHUNK = b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,' \
                   b'"completion_tokens":5,"total_tokens":10}}\n\n'  # fmt: skip


# --- the Responses API ------------------------------------------------------------------------------------------
def _response(status: str, text: str | None) -> dict[str, Any]:
    """A Responses API `response` object as vLLM writes it: `text` None while in progress (no output yet)."""
    output = [] if text is None else [_item("completed", text)]
    usage = None if text is None else {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10,
    }  # fmt: skip
    return {
        "id": f"resp_{ID}", "created_at": 0, "incomplete_details": None, "instructions": None, "metadata": None,
        "model": "bench", "object": "response", "output": output, "parallel_tool_calls": True, "temperature": 1.0,
        "tool_choice": "auto", "tools": [], "top_p": 1.0, "background": False, "max_output_tokens": 64,
        "max_tool_calls": None, "previous_response_id": None, "prompt": None, "reasoning": None,
        "service_tier": "auto", "status": status, "text": None, "top_logprobs": None, "truncation": "disabled",
        "usage": usage, "user": None,
    }  # fmt: skip


def _item(status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    return {"id": f"msg_{ID}", "content": content, "role": "assistant", "status": status, "type": "message"}


def _part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def _responses_stream() -> list[bytes]:
    sequence = iter(range(1000))
    where = {"item_id": f"msg_{ID}", "output_index": 0}
    text = "".join(DELTAS)

    def event(kind: str, **fields: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(sequence), **fields})

    opening = (event("response.created", response=_response("in_progress", None))
               + event("response.in_progress", response=_response("in_progress", None))
               + event("response.output_item.added", output_index=0, item=_item("in_progress", None))
               + event("response.content_part.added", **where, content_index=0, part=_part("")))  # fmt: skip
    deltas = [event("response.output_text.delta", **where, content_index=0, delta=d, logprobs=[]) for d in DELTAS]
    closing = (event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
               + event("response.content_part.done", **where, content_index=0, part=_part(text))
               + event("response.output_item.done", output_index=0, item=_item("completed", text))
               + event("response.completed", response=_response("completed", text)))  # fmt: skip
    return [opening + deltas[0], *deltas[1:], closing]


# --- the Anthropic Messages API ---------------------------------------------------------------------------------
def _message(text: str | None, output_tokens: int) -> dict[str, Any]:
    return {
        "id": f"msg_{ID}", "type": "message", "role": "assistant",
        "content": [] if text is None else [{"type": "text", "text": text}], "model": "bench",
        "stop_reason": None if text is None else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": output_tokens},
    }  # fmt: skip


def _messages_stream() -> list[bytes]:
    def event(kind: str, **fields: Any) -> bytes:
        return _sse(kind, {"type": kind, **fields})

    deltas = [event("content_block_delta", index=0, delta={"type": "text_delta", "text": d}) for d in DELTAS]
    opening = (event("message_start", message=_message(None, 0))
               + event("content_block_start", index=0, content_block={"type": "text", "text": ""}))  # fmt: skip
    closing = (event("content_block_stop", index=0)
               + event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
                       usage={"output_tokens": len(DELTAS)})
               + event("message_stop"))  # fmt: skip
    return [opening + deltas[0], *deltas[1:], closing]


ANSWERS: dict[bytes, tuple[bytes, list[bytes]]] = {
    b"/chat/completions": (CHAT, CHAT_CHUNKS),
    b"/responses": (_dumps(_response("completed", "ok")), _responses_stream()),
    b"/messages": (_dumps(_message("ok", 1)), _messages_stream()),
}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def request(api: str, stream: bool, model: str = "auto") -> str:
    """The body the load generator sends to `api`: one user turn asking `PROMPT`, in that API's shape, written as
    the load generator writes chat's."""
    turn = [{"role": "user", "content": PROMPT}]
    if api == "chat":
        return json.dumps({"model": model, "stream": stream, "messages": turn})
    if api == "responses":
        return json.dumps({"model": model, "stream": stream, "input": turn})
    if api == "messages":
        return json.dumps({"model": model, "stream": stream, "max_tokens": 64, "messages": turn})
    raise ValueError(f"unknown api {api!r}")
