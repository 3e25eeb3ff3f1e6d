"""The tokens an upstream says an answer took (issue 29.2), read per client API without holding or changing what the
client sees: a JSON answer's `usage`; of a stream, chat's and completions' usage chunk, Responses'
`response.completed` (or `.incomplete`, `.failed`), Anthropic's `message_start` and `message_delta`.

    reader = UsageReader("chat", asked=True)      # asked: the router asked for the usage chunk (the client did not)
    watch = reader.watch()                         # router/_asgi/answer.py `Watch`: feed(chunk) -> what goes on
    reader.body(raw)                               # a JSON answer, decoded
    reader.tokens                                  # Tokens(input=.., cached=.., output=.., reported=True)

Only the events holding `"usage"` are parsed (a chat stream's other chunks are never looked at). Chat and
completions stream usage only when asked (`stream_options.include_usage`): `ask_usage` adds it to a streamed
request that lacks it, and the reader then cuts that chunk out, so that the client gets the stream it asked for.
A table keyed by the API's name, as router/_apis/answers.py's readers are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from router._asgi.answer import Watch
from router._asgi.sse import json_data
from router._observe.usage import Tokens

_USAGE = b'"usage"'
_ASKED = b'"stream_options":{"include_usage":true},'


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _openai(usage: dict[str, Any], tokens: Tokens, prompt: str, completion: str) -> bool:
    """Chat's and completions' (`prompt_tokens`...) and Responses' (`input_tokens`...) usage objects."""
    given, done = _int(usage.get(prompt)), _int(usage.get(completion))
    if given is None and done is None:
        return False
    tokens.input, tokens.output = given or 0, done or 0
    details = _dict(usage.get("prompt_tokens_details" if prompt == "prompt_tokens" else "input_tokens_details"))
    tokens.cached = _int(details.get("cached_tokens")) or 0
    tokens.reported = True
    return True


def _anthropic(usage: dict[str, Any], tokens: Tokens) -> bool:
    """Anthropic's usage: `input_tokens` leaves out the prompt cache's reads and writes; counted here with them (the
    input the model read), the reads as `cached`. A `message_delta` carries the output so far, and may carry input."""
    found = False
    if (given := _int(usage.get("input_tokens"))) is not None:
        read = _int(usage.get("cache_read_input_tokens")) or 0
        tokens.input = given + read + (_int(usage.get("cache_creation_input_tokens")) or 0)
        tokens.cached, found = read, True
    if (done := _int(usage.get("output_tokens"))) is not None:
        tokens.output, found = done, True
    tokens.reported = tokens.reported or found
    return found


def _chat_body(body: dict[str, Any], tokens: Tokens) -> None:
    _openai(_dict(body.get("usage")), tokens, "prompt_tokens", "completion_tokens")


def _responses_body(body: dict[str, Any], tokens: Tokens) -> None:
    _openai(_dict(body.get("usage")), tokens, "input_tokens", "output_tokens")


def _messages_body(body: dict[str, Any], tokens: Tokens) -> None:
    _anthropic(_dict(body.get("usage")), tokens)


JSON_USAGE: Mapping[str, Callable[[dict[str, Any], Tokens], None]] = {
    "chat": _chat_body, "completions": _chat_body, "responses": _responses_body, "messages": _messages_body,
}  # fmt: skip


# An event's reader: whether the event is the usage chunk alone (which the router may have asked for: then cut out).
def _chat_event(event: dict[str, Any], tokens: Tokens) -> bool:
    found = _openai(_dict(event.get("usage")), tokens, "prompt_tokens", "completion_tokens")
    return found and not event.get("choices")


def _responses_event(event: dict[str, Any], tokens: Tokens) -> bool:
    if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
        _openai(_dict(_dict(event.get("response")).get("usage")), tokens, "input_tokens", "output_tokens")
    return False


def _messages_event(event: dict[str, Any], tokens: Tokens) -> bool:
    kind = event.get("type")
    if kind == "message_start":
        _anthropic(_dict(_dict(event.get("message")).get("usage")), tokens)
    elif kind == "message_delta":
        _anthropic(_dict(event.get("usage")), tokens)
    return False


EVENT_USAGE: Mapping[str, Callable[[dict[str, Any], Tokens], bool]] = {
    "chat": _chat_event, "completions": _chat_event, "responses": _responses_event, "messages": _messages_event,
}  # fmt: skip
ASKS_USAGE = frozenset({"chat", "completions"})  # streams usage only when asked (stream_options.include_usage)


class UsageReader:
    """The tokens of one upstream answer of `api`; `asked`: the router asked for the stream's usage chunk, which
    then does not reach the client."""

    def __init__(self, api: str, *, asked: bool = False) -> None:
        self.api, self.asked = api, asked
        self.tokens = Tokens()
        self._event = EVENT_USAGE[api]

    def body(self, raw: bytes) -> None:
        """Read a whole JSON answer (decoded); anything else reads as no usage."""
        try:
            body = json.loads(raw)
        except ValueError:
            return
        if isinstance(body, dict):
            JSON_USAGE[self.api](body, self.tokens)

    def event(self, event: bytes) -> bool:
        """Read one stream event holding `"usage"`; False for the usage chunk the router asked for (cut out)."""
        data = json_data(event)
        if data is None:
            return True
        usage_only = self._event(data, self.tokens)
        return not (self.asked and usage_only)

    def watch(self) -> Watch:
        """The stream's watcher: read-only, unless the router asked for the usage chunk (then it holds each event
        until whole, to cut that one out)."""
        return Watch(_USAGE, self.event, hold=self.asked)


def metered(api: str, payload: bytes, body: Mapping[str, Any], count: bool) -> tuple[bytes, UsageReader | None]:
    """What goes to an upstream that counts usage (`count`), with the reader of its answer's tokens: `payload` asking
    for the stream's usage chunk if need be (`ask_usage`). Not counting: `payload` as it is, no reader. The proxy's
    route and the overlap's speculation both send this, byte for byte."""
    if not count:
        return payload, None
    asked = ask_usage(api, payload, body)
    return (payload, UsageReader(api)) if asked is None else (asked, UsageReader(api, asked=True))


def ask_usage(api: str, raw: bytes, body: Mapping[str, Any]) -> bytes | None:
    """`raw` asking for the stream's usage chunk (`stream_options.include_usage`) when `api` streams usage only if
    asked, the request streams and does not ask; else None (nothing to ask, or the client asked itself). The bytes
    are the client's with the option written after the opening brace; a request that has `stream_options` of its
    own is written anew with the option set in it."""
    if api not in ASKS_USAGE or body.get("stream") is not True:
        return None
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    if "stream_options" not in body:
        at = raw.find(b"{")
        if at >= 0:
            return raw[: at + 1] + _ASKED + raw[at + 1 :]
    try:  # the bytes sent, not the client's body: they may be rewritten (the upstream's model, a rule's `set`)
        sent = json.loads(raw)
    except ValueError:
        sent = None
    current = sent if isinstance(sent, dict) else body
    changed = {**current, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
    return json.dumps(changed, ensure_ascii=False, separators=(",", ":")).encode()
