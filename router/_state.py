"""From a request's turns to the decision state the engine reads.

Each client API's adapter (`router/_apis.py`) reads its body into `Turn`s; this module picks the turns the policy's
state reads, budgets the text and vets the media:

    turns = [Turn("system", "Be brief."), Turn("user", "Look at this", (("image", PNG),))]
    state = build_state(turns, policy.state, MediaRules(hosts=frozenset({"img.example.com"})))
    state.state           # what the engine reads: the last user turn, a transcript, or JSON
    state.truncated       # characters cut to fit the budget (oldest first), reported in x-d3-state-truncated

Data URLs pass within a byte budget; http(s) URLs only to hosts the configuration allows (the engine would fetch
them itself); anything else is dropped and counted, never silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from d3backend import JSONValue
from policies import StateSettings


class BadRequest(ValueError):
    """The request cannot be decided as it is; `param` names the offending field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        super().__init__(message)


BadChatRequest = BadRequest  # the name of the first release, when only chat was decided


@dataclass(frozen=True, slots=True)
class MediaRules:
    hosts: frozenset[str] = frozenset()
    max_bytes: int = 8 * 1024 * 1024
    max_items: int = 16


DEFAULT_MEDIA = MediaRules()


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of a conversation, whatever the API: its role, its text, and its images and videos."""

    role: str  # system, developer, user, assistant or tool
    text: str
    media: tuple[tuple[str, str], ...] = ()  # ("image" | "video", url)
    calls: tuple[str, ...] = ()  # the assistant's tool calls, each `[tool call] name(arguments)`

    @property
    def shown(self) -> str:
        """The turn as the decision reads it: its text, then its tool calls, a line each."""
        return "\n".join([self.text, *self.calls]) if self.text else "\n".join(self.calls)


@dataclass(frozen=True, slots=True)
class DecisionState:
    state: JSONValue
    images: tuple[str, ...] = ()
    videos: tuple[str, ...] = ()
    truncated: int = 0  # characters cut from the oldest text
    dropped: tuple[str, ...] = field(default=())  # why each dropped media item was dropped
    ignored: int = 0  # content parts left out of the state (server.unknown_parts: ignore)
    # The request's turns as its adapter read them, kept so that what comes after the decision (the session's
    # opening and tool-turn checks) does not read the body again.
    turns: tuple[Turn, ...] = field(default=(), compare=False, repr=False)


def build_state(
    turns: list[Turn], settings: StateSettings, media: MediaRules = DEFAULT_MEDIA, ignored: int = 0
) -> DecisionState:
    """The state for `settings.source` within `settings.max_chars`; `BadRequest` (413) over the media limit."""
    if settings.source == "last_user":
        users = [turn for turn in turns if turn.role == "user"]
        chosen = users[-1:] if users else turns[-1:]
    elif settings.source == "new":
        chosen = since_assistant(turns)
    else:
        chosen = turns
    count = sum(len(turn.media) for turn in chosen)
    if count > media.max_items:
        raise BadRequest(
            f"the request hands {count} images and videos to the decision; at most {media.max_items} are allowed"
            " (server.max_media_items)",
            status=413,
        )
    texts = [turn.shown for turn in chosen]
    images, videos, dropped = _media(chosen, media)
    budget = settings.max_chars
    if settings.source == "json":
        kept, cut = _budget(texts, budget)
        roles = [turn.role for turn in chosen][len(chosen) - len(kept) :]
        state: JSONValue = [{"role": role, "content": text} for role, text in zip(roles, kept, strict=True)]
    elif settings.source in ("conversation", "new"):
        lines = [f"{turn.role}: {turn.shown}" for turn in chosen]
        kept, cut = _budget(lines, budget, separator=2)
        state = "\n\n".join(kept)
    else:
        kept, cut = _budget(texts, budget)
        state = kept[0] if kept else ""
    return DecisionState(state, tuple(images), tuple(videos), cut, tuple(dropped), ignored, tuple(turns))


def since_assistant(turns: list[Turn]) -> list[Turn]:
    """What is new since the assistant last spoke: the tool calls of its last turn (what it is about to act on) and
    every turn after it but system prompts (the user's words, tool results, fetched content). An agent loop's new
    input, which `last_user` would miss: there the last user turn is the task given many turns ago."""
    last = len(turns) - 1
    while last >= 0 and turns[last].role != "assistant":
        last -= 1
    first = last
    while first > 0 and turns[first - 1].role == "assistant" and not turns[first - 1].text:
        first -= 1  # parallel tool calls come as several assistant items (Responses API)
    calls = tuple(call for turn in turns[max(first, 0) : last + 1] for call in turn.calls) if last >= 0 else ()
    after = [turn for turn in turns[last + 1 :] if turn.role not in ("system", "developer")]
    chosen = ([Turn("assistant", "", (), calls)] if calls else []) + after
    return chosen or turns[-1:]


class Content:
    """Reads content parts into text and media, counting (or refusing) the parts no decision can read.

    Each API names its parts differently; `text_fields` maps a text-carrying type to the field holding its text."""

    def __init__(self, *, lenient: bool) -> None:
        self.lenient = lenient
        self.ignored = 0

    def unreadable(self, kind: str, where: str, what: str | None = None) -> None:
        """A part the router cannot read: refused (400, the default) or left out and counted. `what` says what
        the part is where its type alone would mislead (`is an image by file_id`)."""
        if not self.lenient:
            raise BadRequest(
                f"{where} {what or f'has type {kind!r}'}, which d3-router cannot read for its decision; send text,"
                " images or videos, or set server.unknown_parts: ignore to leave such parts out of the decision",
                f"{where}.type",
            )
        self.ignored += 1


def json_text(value: Any, where: str) -> str:
    """A JSON value as text (a tool call's arguments); `BadRequest` if it is nested too deeply to write out again
    (a body the parser just accepted can be, a few stack frames further down)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        raise BadRequest(f"{where} is nested too deeply to be read for the decision", where) from None


def need_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, found {kind_of(value)}", where)
    return value


def need_list(value: Any, where: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be {what}, found {kind_of(value)}", where)
    return value


def need_object(value: Any, where: str, what: str = "an object with a `type`") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be {what}", where)
    return value


def _media(turns: list[Turn], rules: MediaRules) -> tuple[list[str], list[str], list[str]]:
    images: list[str] = []
    videos: list[str] = []
    dropped: list[str] = []
    spent = 0
    for turn in turns:
        for kind, url in turn.media:
            if not url:
                dropped.append(f"{kind} without a url")
                continue
            reason = _refuse(url, rules, spent)
            if reason:
                dropped.append(reason)
                continue
            if url.startswith("data:"):
                spent += len(url)
            (images if kind == "image" else videos).append(url)
    return images, videos, dropped


def _refuse(url: str, rules: MediaRules, spent: int) -> str | None:
    """Why `url` may not be handed to the engine, or None."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        header = url[5 : url.find(",")] if "," in url else ""
        if not header.endswith(";base64") or not header.split(";")[0].startswith(("image/", "video/")):
            return "malformed data URL"
        if spent + len(url) > rules.max_bytes:
            return "data URLs over the media budget"
        return None
    if scheme in ("http", "https"):
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError:
            return "malformed URL"
        return None if host in rules.hosts else f"host {host or '?'} not in server.media_hosts"
    return f"scheme {scheme or '?'} not allowed"


def _budget(texts: list[str], budget: int, separator: int = 1) -> tuple[list[str], int]:
    """Keep the newest texts within `budget` characters, cutting the oldest first; return them and what was cut."""
    kept: list[str] = []
    used = 0
    total = sum(len(text) for text in texts)
    for text in reversed(texts):
        room = budget - used
        if room <= 0:
            break
        piece = text if len(text) <= room else text[len(text) - room :]
        kept.append(piece)
        used += len(piece) + separator
    kept.reverse()
    return kept, total - sum(len(text) for text in kept)


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")
