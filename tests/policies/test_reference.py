"""The configuration reference rendered from a JSON Schema: every section and key, types, defaults, constraints."""

from __future__ import annotations

import re
from typing import Any

import pytest

from policies import ConfigSpec, reference_markdown

SCHEMA: dict[str, Any] = {
    "$defs": {
        "Limits": {
            "description": "How much a request may carry",
            "properties": {
                "bytes": {"type": "integer", "exclusiveMinimum": 0, "default": 4096, "description": "Body size."},
                "level": {"type": "integer", "minimum": 2, "maximum": 9, "default": 2},
                "mode": {"enum": ["refuse", "ignore"], "type": "string", "default": "refuse"},
                "hosts": {"type": "array", "items": {"type": "string"}, "description": "Hosts | allowed."},
            },
            "type": "object",
        },
        "Item": {
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            },
            "required": ["name"],
            "type": "object",
        },
    },
    "description": "A file.",
    "properties": {
        "limits": {"$ref": "#/$defs/Limits", "default": {"bytes": 4096}},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1},
        "named": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Item"}},
    },
    "required": ["items"],
    "type": "object",
}


def rows(text: str) -> dict[str, list[str]]:
    """Each section's heading -> its table rows."""
    sections: dict[str, list[str]] = {}
    heading = ""
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:]
            sections[heading] = []
        elif line.startswith("| `") and heading:
            sections[heading].append(line)
    return sections


def test_every_object_gets_a_section_named_by_its_path_in_schema_order() -> None:
    sections = rows(reference_markdown(SCHEMA))
    assert list(sections) == ["Sections", "The file's top level", "`limits`", "`items[]`", "`named.NAME`"]
    assert sections["`limits`"] == [
        "| `bytes` | integer, > 0 | `4096` | Body size. |",
        "| `level` | integer, 2 to 9 | `2` |  |",
        '| `mode` | `"refuse"` \\| `"ignore"` | `"refuse"` |  |',
        "| `hosts` | list of string | `[]` | Hosts \\| allowed. |",
    ]
    assert sections["`items[]`"] == [
        "| `name` | string, not empty | required |  |",
        "| `note` | string or null | `null` |  |",
    ]


def test_top_level_rows_link_to_their_sections() -> None:
    top = rows(reference_markdown(SCHEMA))["The file's top level"]
    assert top == [
        "| `limits` | [object](#limits) | its keys' defaults | How much a request may carry. |",
        "| `items` | list of [object](#items), not empty | required |  |",
        "| `named` | mapping of name to [object](#namedname) | `{}` |  |",
    ]


def test_the_same_schema_gives_the_same_text() -> None:
    schema = ConfigSpec.model_json_schema(by_alias=True)
    assert reference_markdown(schema) == reference_markdown(schema)
    assert reference_markdown(schema).endswith("\n")


def test_the_configuration_reference_covers_every_key_of_every_model() -> None:
    schema = ConfigSpec.model_json_schema(by_alias=True)
    text = reference_markdown(schema)
    documented = {
        (heading, re.match(r"\| `([^`]+)`", row).group(1)) for heading, lines in rows(text).items() for row in lines
    }  # type: ignore[union-attr]
    keys = {key for _, key in documented}
    for name, definition in schema["$defs"].items():
        missing = set(definition["properties"]) - keys
        assert not missing, f"{name}: {sorted(missing)} not in the reference"
    headings = set(rows(text))
    for path in ("`server.sessions`", "`engine.remote`", "`upstreams.NAME`", "`policies.NAME.rules[].block`",
                 "`policies.NAME.questions.ID`, `type: score`", "`policies.NAME.tests[].expect`"):  # fmt: skip
        assert path in headings


def test_every_key_of_the_configuration_has_a_description() -> None:
    """A key without one would be a bare row in docs/configuration.md: say what it does in the model's Field."""
    schema = ConfigSpec.model_json_schema(by_alias=True)
    bare = [
        f"{name}.{key}"
        for name, definition in schema["$defs"].items()
        for key, prop in definition["properties"].items()
        if key != "type" and not prop.get("description") and not _ref_description(schema, prop)
    ]
    assert bare == []


def _ref_description(schema: dict[str, Any], prop: dict[str, Any]) -> str:
    for branch in [prop, *prop.get("anyOf", [])]:
        ref = branch.get("$ref", "")
        if ref:
            return str(schema["$defs"][ref.rsplit("/", 1)[1]].get("description", ""))
    return ""


@pytest.mark.parametrize(
    ("prop", "expected"),
    [
        ({"type": "string", "pattern": "^a+$"}, "string, matching `^a+$`"),
        (
            {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 10},
            "list of string, at least 2 items, at most 10 items",
        ),
        ({"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "null"}]}, "integer or null, > 0"),
        ({"type": "object", "additionalProperties": True}, "mapping"),
        ({"const": "x"}, '`"x"`'),
        ({"type": "object", "maxProperties": 1}, "mapping, at most 1 entry"),
    ],
)
def test_types_and_constraints_in_words(prop: dict[str, Any], expected: str) -> None:
    text = reference_markdown({"properties": {"key": prop}, "required": ["key"], "type": "object"})
    assert f"| `key` | {expected} | required |" in text
