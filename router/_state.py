"""From a chat request's messages to the decision state the engine reads.

    state = extract_state(messages, policy.state, media=MediaRules(hosts=frozenset({"img.example.com"})))
    state.text            # what the engine reads: the last user turn, a transcript, or JSON
    state.truncated       # characters cut to fit the budget (oldest first), reported in x-d3-state-truncated

Text parts are joined; `image_url` parts become `images` and `video_url` parts `videos`. Data URLs pass within a
byte budget; http(s) URLs only to hosts the configuration allows (the engine would fetch them itself); anything
else is dropped and counted, never silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from d3backend import JSONValue
from policies import StateSettings


class BadChatRequest(ValueError):
    """The chat request cannot be read; `param` names the offending field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.message = message
        self.param = param
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class MediaRules:
    hosts: frozenset[str] = frozenset()
    max_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class DecisionState:
    state: JSONValue
    images: tuple[str, ...] = ()
    videos: tuple[str, ...] = ()
    truncated: int = 0  # characters cut from the oldest text
    dropped: tuple[str, ...] = field(default=())  # why each dropped media item was dropped


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def extract_state(messages: Any, settings: StateSettings, media: MediaRules = MediaRules()) -> DecisionState:
    """Build the state for `settings.source` within `settings.max_chars`; raise `BadChatRequest`."""
    turns = _read_messages(messages)
    if settings.source == "last_user":
        users = [turn for turn in turns if turn[0] == "user"]
        chosen = users[-1:] if users else turns[-1:]
    else:
        chosen = turns
    texts = [text for _, text, _ in chosen]
    images, videos, dropped = _media([parts for _, _, parts in chosen], media)
    budget = settings.max_chars
    if settings.source == "json":
        kept, cut = _budget(texts, budget)
        roles = [role for role, _, _ in chosen][len(chosen) - len(kept) :]
        state: JSONValue = [{"role": role, "content": text} for role, text in zip(roles, kept, strict=True)]
    elif settings.source == "conversation":
        lines = [f"{role}: {text}" for role, text, _ in chosen]
        kept, cut = _budget(lines, budget, separator=2)
        state = "\n\n".join(kept)
    else:
        kept, cut = _budget(texts, budget)
        state = kept[0] if kept else ""
    return DecisionState(state, tuple(images), tuple(videos), cut, tuple(dropped))


def _read_messages(messages: Any) -> list[tuple[str, str, list[dict[str, Any]]]]:
    if messages is None:
        raise BadChatRequest("`messages` is missing; expected a list of chat messages", "messages")
    if not isinstance(messages, list):
        raise BadChatRequest(f"`messages` must be a list, found {_kind(messages)}", "messages")
    if not messages:
        raise BadChatRequest("`messages` is empty; expected at least one message", "messages")
    turns = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadChatRequest(f"{where} must be an object with `role` and `content`, found {_kind(message)}", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise BadChatRequest(f"{where}.role must be one of {', '.join(sorted(_ROLES))}", f"{where}.role")
        text, parts = _content(message.get("content"), f"{where}.content")
        turns.append((role, text, parts))
    return turns


def _content(content: Any, where: str) -> tuple[str, list[dict[str, Any]]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise BadChatRequest(f"{where} must be a string or a list of content parts, found {_kind(content)}", where)
    texts: list[str] = []
    media: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadChatRequest(f"{where}[{index}] must be an object with a `type`", f"{where}[{index}]")
        if part["type"] == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise BadChatRequest(f"{where}[{index}].text must be a string", f"{where}[{index}].text")
            texts.append(text)
        elif part["type"] in ("image_url", "video_url"):
            media.append(part)
    return "\n".join(texts), media


def _media(groups: Sequence[list[dict[str, Any]]], rules: MediaRules) -> tuple[list[str], list[str], list[str]]:
    images: list[str] = []
    videos: list[str] = []
    dropped: list[str] = []
    spent = 0
    for parts in groups:
        for part in parts:
            kind = part["type"]
            holder = part.get(kind)
            url = holder.get("url") if isinstance(holder, dict) else holder
            if not isinstance(url, str) or not url:
                dropped.append(f"{kind} without a url")
                continue
            reason = _refuse(url, rules, spent)
            if reason:
                dropped.append(reason)
                continue
            if url.startswith("data:"):
                spent += len(url)
            (images if kind == "image_url" else videos).append(url)
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
        host = (urlsplit(url).hostname or "").lower()
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


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")
