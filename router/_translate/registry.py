"""Which translations exist: the pairs registered by this package's modules, and those composed through chat.

    translation("messages", "chat")        # registered directly (router/_translate/messages_chat.py)
    translation("messages", "responses")   # composed: messages -> chat -> responses, where both halves exist
    translation("chat", "chat")            # None: the same API needs no translation

A pair module registers each direction it offers with `@pair(client, upstream)` on a class whose instances are
`Translation`s (router/_translate/base.py). Every module of this package other than base and registry is a pair
module, imported the first time a translation is asked for: adding a pair is adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from policies import ApiName
from router._translate.base import Body, SseEvent, StreamTranslator, Translation

_PAIRS: dict[tuple[str, str], Callable[[], Translation]] = {}
_FRAMEWORK = frozenset({"base", "registry"})
_loaded = False

T = TypeVar("T")


def pair(client: ApiName, upstream: ApiName) -> Callable[[T], T]:
    """Register the decorated class (made with no arguments) as the translation `client` -> `upstream`."""

    def register(cls: T) -> T:
        _PAIRS[(client, upstream)] = cls  # type: ignore[assignment]
        return cls

    return register


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = importlib.import_module("router._translate")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda found: found.name):
        if info.name not in _FRAMEWORK and not info.name.startswith("_"):
            importlib.import_module(f"router._translate.{info.name}")


def translation(client: str, upstream: str, options: Mapping[str, Any] | None = None) -> Translation | None:
    """The translation a `client` request needs to an `upstream` API: None for the same API or a pair neither
    registered nor composable through chat (X -> chat -> Y, both halves registered). `options` (the upstream's
    settings, e.g. `custom_tools`) are given to each pair that has an attribute of that name."""
    if client == upstream:
        return None
    _load()
    made = _PAIRS.get((client, upstream))
    if made is not None:
        return _with(made(), options)
    first, second = _PAIRS.get((client, "chat")), _PAIRS.get(("chat", upstream))
    if first is None or second is None:
        return None
    return Composed(_with(first(), options), _with(second(), options))


def _with(tr: Translation, options: Mapping[str, Any] | None) -> Translation:
    for key, value in (options or {}).items():
        if hasattr(tr, key):
            setattr(tr, key, value)
    return tr


def pairs() -> list[tuple[str, str]]:
    """Every (client, upstream) pair a translation exists for, composed ones included."""
    _load()
    apis = sorted({api for found in _PAIRS for api in found})
    return [(a, b) for a in apis for b in apis if a != b and translation(a, b) is not None]


class Composed:
    """`first` (client -> chat) then `second` (chat -> upstream); answers come back through both in reverse."""

    def __init__(self, first: Translation, second: Translation) -> None:
        self.first, self.second = first, second
        self.client, self.upstream = first.client, second.upstream
        self.upstream_path = second.upstream_path

    def request(self, body: Body) -> tuple[Body, list[str]]:
        middle, lost = self.first.request(body)
        out, more = self.second.request(middle)
        return out, _merged(lost, more)

    def answer(self, body: Body) -> tuple[Body, list[str]]:
        middle, lost = self.second.answer(body)
        out, more = self.first.answer(middle)
        return out, _merged(lost, more)

    def stream(self) -> StreamTranslator:
        return _ComposedStream(self.second.stream(), self.first.stream())

    def error(self, status: int, body: bytes) -> bytes:
        return self.first.error(status, self.second.error(status, body))


class _ComposedStream:
    def __init__(self, inner: StreamTranslator, outer: StreamTranslator) -> None:
        self.inner, self.outer = inner, outer

    @property
    def losses(self) -> list[str]:
        return _merged(self.inner.losses, self.outer.losses)

    def feed(self, chunk: bytes | SseEvent) -> bytes:
        middle = self.inner.feed(chunk)
        return self.outer.feed(middle) if middle else b""

    def flush(self) -> bytes:
        middle = self.inner.flush()
        return (self.outer.feed(middle) if middle else b"") + self.outer.flush()

    def error(self, message: str) -> bytes:
        return self.outer.error(message)


def _merged(first: list[str], second: list[str]) -> list[str]:
    return [*first, *(name for name in second if name not in first)]
