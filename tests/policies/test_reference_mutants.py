"""The configuration reference at its edges: the committed page is the models' rendering, and the words, anchors and
sections of schemas the configuration does not (yet) hold. Pinned where mutmut found a change no test of its
selection noticed (issue 23)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policies import ConfigSpec, reference_markdown
from tests.policies.test_reference import rows

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_is_the_rendering_of_the_models() -> None:
    rendered = reference_markdown(ConfigSpec.model_json_schema(by_alias=True))
    assert rendered == PAGE.read_text(encoding="utf-8"), "run `d3router schema --markdown > docs/configuration.md`"


ITEM: dict[str, Any] = {"properties": {"name": {"type": "string"}}, "required": ["name"], "type": "object"}


def key_row(prop: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """The one row of a top level holding `key: prop`."""
    schema = {"$defs": defs or {}, "properties": {"key": prop}, "type": "object"}
    (row,) = rows(reference_markdown(schema))["The file's top level"]
    return row


def test_a_schema_without_keys_gives_an_empty_table() -> None:
    text = reference_markdown({"type": "object", "description": "Nothing yet"})
    assert (
        "## The file's top level\n\nNothing yet.\n\n| key | type | default | description |\n|---|---|---|---|\n" in text
    )
    assert rows(text)["The file's top level"] == []


def test_an_object_or_a_list_or_mapping_of_them_gets_a_section_for_each() -> None:
    many = {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "array", "items": {"$ref": "#/$defs/Item"}}]}
    named = {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "object", "additionalProperties": {"$ref": "#/$defs/Item"}}]}
    schema = {"$defs": {"Item": ITEM}, "properties": {"many": many, "named": named}, "type": "object"}
    assert list(rows(reference_markdown(schema))) == [
        "Sections", "The file's top level", "`many`", "`many[]`", "`named`", "`named.NAME`"
    ]  # fmt: skip


def test_an_object_whose_default_is_empty_says_so() -> None:
    assert key_row({"$ref": "#/$defs/Item", "default": {}}, {"Item": ITEM}) == "| `key` | [object](#key) | `{}` |  |"


def test_a_reference_to_a_definition_that_is_not_an_object_gives_that_definitions_type() -> None:
    defs = {"Hosts": {"type": "array", "items": {"type": "string"}}, "Mode": {"enum": ["a", "b"], "type": "string"}}
    assert key_row({"$ref": "#/$defs/Hosts"}, defs) == "| `key` | list of string | `{}` |  |"
    assert key_row({"$ref": "#/$defs/Mode", "default": "a"}, defs) == '| `key` | `"a"` \\| `"b"` | `"a"` |  |'


def test_types_the_configuration_does_not_use_yet_in_words() -> None:
    assert key_row({"type": "array", "default": []}) == "| `key` | array | `[]` |  |"
    assert key_row({"description": "Anything", "default": 1}) == "| `key` | any | `1` | Anything. |"
    assert key_row({"type": ["string", "null"], "default": None}) == "| `key` | string or null | `null` |  |"


def test_a_description_ending_in_a_question_an_exclamation_or_a_parenthesis_gets_no_period() -> None:
    for text in ("Is it?", "Never!", "A list (of names)", "Done."):
        assert key_row({"type": "string", "default": "", "description": text}).endswith(f"| {text} |")


def union(*branches: dict[str, Any]) -> str:
    defs = {f"B{i}": branch for i, branch in enumerate(branches)}
    prop = {"discriminator": {"propertyName": "type"}, "oneOf": [{"$ref": f"#/$defs/{name}"} for name in defs]}
    return key_row(prop, defs)


def test_a_tagged_unions_variants_are_named_by_their_tag_else_their_title() -> None:
    by_enum = {"properties": {"type": {"enum": ["noul"]}}, "title": "Noul"}
    by_const = {"properties": {"type": {"const": "score"}}, "title": "Score"}
    untagged = {"properties": {"size": {"type": "integer"}}, "title": "Sized"}
    bare = {"title": "Bare"}
    nameless: dict[str, Any] = {"properties": {}}
    assert union(by_enum, by_const, untagged, bare, nameless) == (
        "| `key` | object, by `type`: [type: noul](#key-type-noul), [type: score](#key-type-score), "
        "[type: Sized](#key-type-sized), [type: Bare](#key-type-bare), [type: ?](#key-type-) | `{}` |  |"
    )
