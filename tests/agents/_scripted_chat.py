"""The scripted model of `_scripted.py`, speaking only Chat Completions (issue 30): a chat-only provider an agent of
another API reaches through the router's translation. Any other path is answered 404.

Each request is checked against the `openai` SDK's chat types (`tests/router/_sdk_shapes.py`): one they do not
take is answered 400, as a strict provider would. The script, in chat's shapes: a request without tools is answered
"ok"; a conversation whose last turn is a tool result is answered "ANSWER: <the result>"; else, when the latest user
text says `READ <path>`, a call of the `Read` tool (Claude Code's) or of Codex's shell tool (`cat <path>`), and when
it says `PATCH <path>`, a call of Codex's custom tool `apply_patch` adding that file (a function call with the
patch as its `input` argument when the tool came as a function, as the router sends it by default); a call's
arguments are streamed in two pieces. With `reasoning_effort`, each answer opens with `reasoning_content`, as vLLM's reasoning parsers give
it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic

from tests.agents._scripted import SHELL_TOOLS, _Handler, _serving, _text, _wanted, shell_arguments
from tests.router._sdk_shapes import chat_request


class _ChatModel(_Handler):
    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        if path.split("?")[0].endswith("/chat/completions"):
            try:
                chat_request(body)  # as the openai SDK's types take it, or refused as a strict provider would
            except (pydantic.ValidationError, AssertionError) as exc:
                error = {"error": {"message": f"not a chat request: {exc}", "type": "invalid_request_error"}}
                return 400, "application/json", json.dumps(error).encode()
            return _chat(body)
        return 404, "application/json", b'{"error": {"message": "this upstream speaks Chat Completions only"}}'


def _chunk(n: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0, "model": "chat-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


def _chat(body: dict[str, Any]) -> tuple[int, str, bytes]:
    messages = body.get("messages") or []
    tools = [(tool.get(tool.get("type") or "function") or {}).get("name") for tool in body.get("tools") or []]
    shell = next((name for name in SHELL_TOOLS if name in tools), None)
    last: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") != "system"), {})
    user = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    n = len(messages)
    wanted = _wanted(user) if tools and last.get("role") != "tool" else None
    text: str = "ok"
    call: dict[str, Any] | None = None
    if last.get("role") == "tool":
        text = "ANSWER: " + _text(last.get("content"))[:300]
    elif wanted and wanted[0] == "PATCH" and "apply_patch" in tools:  # Codex's custom tool: a patch adding a file
        patch = f"*** Begin Patch\n*** Add File: {wanted[1]}\n+patched through chat\n*** End Patch\n"
        kind = next(tool["type"] for tool in body["tools"] if tool[tool["type"]].get("name") == "apply_patch")
        call = ({"id": f"call_{n}", "type": "custom", "custom": {"name": "apply_patch", "input": patch}}
                if kind == "custom" else  # as the router sends it by default: a function taking `input`
                {"id": f"call_{n}", "type": "function",
                 "function": {"name": "apply_patch", "arguments": json.dumps({"input": patch})}})  # fmt: skip
    elif wanted and "Read" in tools:
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": "Read", "arguments": json.dumps({"file_path": wanted[1]})}}  # fmt: skip
    elif wanted and shell:  # Codex's shell tool, translated from its Responses request
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": shell, "arguments": shell_arguments(shell, wanted)}}  # fmt: skip
    reasoning = "The script says what to do." if body.get("reasoning_effort") else None
    finish = "tool_calls" if call else "stop"
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": None if call else text}
        if call:
            message["tool_calls"] = [call]
        if reasoning:
            message["reasoning_content"] = reasoning
        answer = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": "chat-model",
                  "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}  # fmt: skip
        return 200, "application/json", json.dumps(answer).encode()
    chunks = [_chunk(n, {"role": "assistant", "content": ""})]
    if reasoning:
        chunks.append(_chunk(n, {"reasoning_content": reasoning}))
    if call:
        kind = call["type"]
        field = "arguments" if kind == "function" else "input"
        arguments = call[kind][field]
        half = len(arguments) // 2
        chunks += [
            _chunk(n, {"tool_calls": [{"index": 0, "id": call["id"], "type": kind,
                                       kind: {"name": call[kind]["name"], field: arguments[:half]}}]}),
            _chunk(n, {"tool_calls": [{"index": 0, kind: {field: arguments[half:]}}]}),
        ]  # fmt: skip
    else:
        chunks += [_chunk(n, {"content": word}) for word in re.findall(r"\S+\s*", text)]
    chunks.append(_chunk(n, {}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**_chunk(n, {}), "choices": [], "usage": usage})
    data = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
    return 200, "text/event-stream", data


def chat_upstream() -> Any:
    return _serving(_ChatModel)
