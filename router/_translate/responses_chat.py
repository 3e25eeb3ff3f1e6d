"""The Responses API <-> Chat Completions pair, both ways (issue 30.1): Responses clients (Codex, the `openai` SDK's
`responses`) carried by a chat upstream, and chat clients carried by a Responses upstream.

    tr = translation("responses", "chat")
    chat_body, lost = tr.request(responses_body)   # instructions -> a system message, input items -> messages
    response, lost = tr.answer(chat_completion)    # choices[0] -> output items, finish_reason -> status

The requests are in `_responses_requests`, the whole answers in `_responses_answers`, the streams in
`_responses_streams`; docs/translation.md says what is carried and what is named. One instance serves one request:
the answer repeats the request's instructions, tools and parameters, as a Responses server's does, and a chat
client gets the stream's usage only when it asked for it (`stream_options.include_usage`).
"""

from __future__ import annotations

from policies import ApiName
from router._apis.chat import CHAT
from router._apis.responses import RESPONSES
from router._translate._chat_requests import chat_to_responses
from router._translate._responses_answers import chat_to_response, response_to_chat
from router._translate._responses_requests import error_body, responses_to_chat
from router._translate._responses_streams import ChatFromResponses, ResponsesFromChat
from router._translate.base import Body
from router._translate.registry import pair


@pair("responses", "chat")
class ResponsesOverChat:
    """A Responses request to a Chat Completions upstream. `previous_response_id`, `conversation` and `prompt` are
    refused (400): they name state a chat upstream has not got. Built-in tools, reasoning items and `store` are
    named and left out. Custom tools go as function tools taking one string (`custom_tools = "function"`, the
    default: what every chat server takes), or as chat's own custom tools (`"native"`: OpenAI's chat API)."""

    client: ApiName = "responses"
    upstream: ApiName = "chat"
    upstream_path = CHAT.upstream_path

    def __init__(self) -> None:
        self.asked: Body = {}
        self.custom_tools = "function"

    def request(self, body: Body) -> tuple[Body, list[str]]:
        self.asked = body
        return responses_to_chat(body, self.custom_tools)

    def answer(self, body: Body) -> tuple[Body, list[str]]:
        return chat_to_response(body, self.asked, self.custom_tools)

    def stream(self) -> ResponsesFromChat:
        return ResponsesFromChat(self.asked, self.custom_tools)

    def error(self, status: int, body: bytes) -> bytes:
        return error_body(status, body)


@pair("chat", "responses")
class ChatOverResponses:
    """A chat request to a Responses upstream, not stored there (`store: false` unless the client asked to store).
    Stop sequences, `n`, penalties, `seed` and `logit_bias` have no Responses field: named and left out."""

    client: ApiName = "chat"
    upstream: ApiName = "responses"
    upstream_path = RESPONSES.upstream_path

    def __init__(self) -> None:
        self.include_usage = False

    def request(self, body: Body) -> tuple[Body, list[str]]:
        options = body.get("stream_options")
        self.include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        return chat_to_responses(body)

    def answer(self, body: Body) -> tuple[Body, list[str]]:
        return response_to_chat(body)

    def stream(self) -> ChatFromResponses:
        return ChatFromResponses(self.include_usage)

    def error(self, status: int, body: bytes) -> bytes:
        return error_body(status, body)
