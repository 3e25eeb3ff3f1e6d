"""The tokens of a `when` condition, and the error a condition that does not compile raises."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,|\.|-)
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false"}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


class ExpressionError(Exception):
    """A `when` condition that does not parse or does not type-check; `pos` is the fault's offset."""

    def __init__(self, message: str, source: str, pos: int, *, show_source: bool = True) -> None:
        self.message = message
        self.source = source
        self.pos = pos
        super().__init__(f"{message}\n    {source}\n    {' ' * pos}^" if show_source else message)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # number, string, name, keyword, op, end
    text: str
    pos: int


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise ExpressionError(f"unexpected character {source[pos]!r}", source, pos)
        kind = match.lastgroup or ""
        text = match.group()
        if kind == "name" and text in _KEYWORDS:
            kind = "keyword"
        if kind != "space":
            tokens.append(Token(kind, text, pos))
        pos = match.end()
    tokens.append(Token("end", "", len(source)))
    return tokens


def unquote(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text[1:-1])
