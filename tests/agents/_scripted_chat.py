"""A scripted model that speaks only Chat Completions (issue 30): what `_scripted`'s model answers, written as chat
completions and chunks, so that an agent of another API (Codex, Responses) reaches it only through the router's
translation. Its `/responses` and `/messages` answer 404, as a chat-only provider's do.

    with scripted_chat_upstream() as upstream:
        ...  # an upstream with `api: chat` in d3router.yaml
        upstream.seen  # the chat requests the router sent

The script: a conversation whose last message is a tool result is answered "ANSWER: <the result>"; else, when the
latest user text says `READ <path>` and a shell tool is offered, a call of that tool running `cat <path>` (its
arguments streamed in two pieces); else "ok". Every answer brings a `reasoning_content` first, as vLLM's reasoning
parsers do.
"""

from __future__ import annotations

import json
from typing import Any

from tests.agents._scripted import SHELL_TOOLS, _Handler, _serving, _text, _wanted


def _chat(body: dict[str, Any]) -> tuple[int, str, bytes]:
    messages = body.get("messages") or []
    tools = [(tool.get("function") or tool.get("custom") or {}).get("name") for tool in body.get("tools") or []]
    last = messages[-1] if messages else {}
    user = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    n = len(messages)
    shell = next((name for name in SHELL_TOOLS if name in tools), None)
    wanted = _wanted(user) if tools and last.get("role") != "tool" else None
    message: dict[str, Any] = {"role": "assistant", "reasoning_content": "The script says what to do."}
    if last.get("role") == "tool":
        message["content"] = "ANSWER: " + _text(last.get("content"))[:300]
    elif wanted and shell:
        command: Any = {"shell_command": {"command": f"cat {wanted[1]}"}, "exec_command": {"cmd": f"cat {wanted[1]}"}
                        }.get(shell, {"command": ["cat", wanted[1]]})  # fmt: skip
        call = {"id": f"call_{n}", "type": "function", "function": {"name": shell, "arguments": json.dumps(command)}}
        message["content"], message["tool_calls"] = None, [call]
    else:
        message["content"] = "ok"
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    head = {"id": f"chatcmpl-{n}", "created": 0, "model": str(body.get("model"))}
    if not body.get("stream"):
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        completion = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        return 200, "application/json", json.dumps(completion).encode()

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": message["reasoning_content"]})]
    if message.get("content"):
        text = message["content"]
        chunks += [chunk({"content": text[: len(text) // 2]}), chunk({"content": text[len(text) // 2 :]})]
    for index, call in enumerate(message.get("tool_calls") or ()):
        arguments = call["function"]["arguments"]
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]}))  # fmt: skip
        for piece in (arguments[:5], arguments[5:]):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return 200, "text/event-stream", data


class _ChatModel(_Handler):
    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        if path.split("?")[0].endswith("/chat/completions"):
            return _chat(body)
        return 404, "application/json", b'{"error": {"message": "this upstream speaks Chat Completions only"}}'


def scripted_chat_upstream() -> Any:
    return _serving(_ChatModel)
