"""The decision state: a request's turns, made into the text and images the engine is asked about
(`build_state`), within the policy's budget and the server's media rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from d3backend import JSONValue
from policies import StateSettings
from router._errors import BadRequest, BodyTooLarge

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
        raise BodyTooLarge(
            f"the request hands {count} images and videos to the decision; at most {media.max_items} are allowed"
            " (server.max_media_items)"
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
        host = _host(url)
        return None if host in rules.hosts else f"host {host or '?'} not in server.media_hosts"
    return f"scheme {scheme or '?'} not allowed"


# An http(s) URL every parser reads alike (issue 25.6): visible ASCII only, no userinfo, no backslash, no
# percent-encoding in the host, a host of letters, digits, dots and dashes (or a bracketed IPv6 address), a numeric
# port. `http://169.254.169.254\\@img.example.com/` is host img.example.com to urlsplit, 169.254.169.254 to WHATWG.
# The scheme in any case (RFC 3986 3.1: case-insensitive; `HTTPS://` is read alike by every parser).
_PLAIN_URL = re.compile(
    r"^(?i:https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?(?:[/?#][\x21-\x5b\x5d-\x7e]*)?$"
)


def _host(url: str) -> str:
    """The host of an http(s) media URL; `BadRequest` (400) for one two URL parsers could read differently."""
    match = _PLAIN_URL.match(url)
    try:
        parsed = (urlsplit(url).hostname or "").lower() if match else None
    except ValueError:
        parsed = None
    if match is None or parsed is None or parsed != match.group(1).lower().strip("[]"):
        raise BadRequest(
            "a media URL holds userinfo, a backslash, a space, a non-ASCII character or a host URL parsers read "
            "differently; send a plain http(s)://host/path URL or a data URL",
            param="messages",
        )
    return parsed


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
