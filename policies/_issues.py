"""A pydantic `ValidationError` as the policy language's issues: each names the file, the line and the key, and says
what was expected and what was found."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from policies._errors import Issue, Path
from policies._yaml import Marks

_TYPE_WORDS = {
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "none_required": "null",
}


def from_pydantic(exc: ValidationError, marks: Marks, file: str) -> list[Issue]:
    by_path: dict[Path, list[tuple[str, Any]]] = {}
    for error in exc.errors(include_url=False):
        path = _resolve(error["loc"], marks)
        kind = error["type"]
        ctx = error.get("ctx") or {}
        if kind == "unknown_key":
            path = (*path, ctx["offending"])
        elif kind == "missing":
            by_path.setdefault(path, []).append(("missing", f"missing required key {error['loc'][-1]!r}"))
            continue
        by_path.setdefault(path, []).append((kind, error))
    issues = []
    for path, errors in by_path.items():
        line, column = locate(path, marks)
        issues.append(Issue(file, line, column, path, _message(errors)))
    return issues


def _message(errors: list[tuple[str, Any]]) -> str:
    if errors[0][0] == "missing":
        return "; ".join(text for _, text in errors)
    words = [_TYPE_WORDS[kind] for kind, _ in errors if kind in _TYPE_WORDS]
    if len(words) == len(errors):  # a type mismatch, possibly against each member of a union
        unique = list(dict.fromkeys(words))
        return f"expected {' or '.join(unique)}, found {kind_of(errors[0][1]['input'])}"
    kind, error = next((k, e) for k, e in errors if k not in _TYPE_WORDS)
    if kind == "union_tag_invalid":
        return f"unknown question type {error['ctx']['tag']!r}; expected 'choice', 'noul' or 'score'"
    if kind == "union_tag_not_found":
        return "missing `type`; expected 'choice', 'noul' or 'score'"
    if kind == "literal_error":
        return f"expected one of {error['ctx']['expected']}, found {error['input']!r}"
    ctx = error.get("ctx") or {}
    found = _short(error["input"])
    if kind == "too_short":
        return f"expected at least {ctx['min_length']} item(s), found {ctx['actual_length']}"
    if kind == "too_long":
        return f"expected at most {ctx['max_length']} item(s), found more"
    if kind == "string_too_short":
        return f"expected a non-empty string, found {found}"
    bounds = {
        "greater_than": "greater than",
        "greater_than_equal": "at least",
        "less_than": "less than",
        "less_than_equal": "at most",
    }
    if kind in bounds:
        return f"expected a number {bounds[kind]} {next(iter(ctx.values()))}, found {found}"
    message: str = error["msg"]
    return message


def _resolve(loc: tuple[str | int, ...], marks: Marks) -> Path:
    """Map a pydantic location to a key path of the file, skipping pydantic's own union-member labels."""
    path: Path = ()
    for part in loc:
        candidate = (*path, part)
        if candidate in marks:
            path = candidate
        elif isinstance(part, str) and (*path, part.lower()) in marks:
            path = (*path, part.lower())
    return path


def locate(path: Path, marks: Marks) -> tuple[int | None, int | None]:
    while path and path not in marks:
        path = path[:-1]
    return marks.get(path, (None, None))


def by_line(issues: list[Issue]) -> list[Issue]:
    return sorted(issues, key=lambda issue: (issue.line or 0, issue.column or 0))


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return _short(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
