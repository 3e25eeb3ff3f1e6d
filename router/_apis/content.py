"""Reading the parts of a client's body: a text part, an object, a list; naming what was found when it is not
what was expected. `Content` counts the parts a lenient reading ignored.
"""

from __future__ import annotations

import json
from typing import Any

from router._errors import BadRequest


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


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")
