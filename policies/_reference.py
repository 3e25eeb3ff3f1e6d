"""The configuration reference (docs/configuration.md), rendered from the configuration's JSON Schema.

`d3router schema --markdown` prints it; a test fails when the committed page differs, so the page cannot drift
from the models in `_schema.py`. Pure: a dict in, a string out.

    >>> text = reference_markdown({"type": "object", "properties": {"port": {"type": "integer", "default": 8080}}})
    >>> "| `port` | integer | `8080` |" in text
    True

Every object the schema reaches gets a section named by its path in the file (`server.sessions`,
`upstreams.NAME`, `policies.NAME.rules[]`), in the order the models declare their keys, depth first. Each key's
row gives its type with its constraints, its default (`required` when it has none; a key that is neither
required nor given a default is an empty list or mapping, pydantic's `default_factory`) and its description.
"""

from __future__ import annotations

import json
import re
from typing import Any

Schema = dict[str, Any]

_INTRO = """\
# Configuration reference

<!-- Generated from the JSON Schema by `d3router schema --markdown > docs/configuration.md`; do not edit by hand.
     The descriptions live in the configuration models, and a test fails when this page is stale. -->

One YAML file holds the engine, the upstreams and the policies. `d3router schema` prints its JSON Schema (a copy is
kept at `examples/d3router.schema.json`), and editors with the YAML language server complete and check files that
start with `# yaml-language-server: $schema=./d3router.schema.json`. `d3router check FILE` validates a file.

Keys are checked strictly: an unknown key is an error that suggests the closest known one, a key given twice is an
error (plain YAML keeps the last silently), and `yes`/`no`/`on`/`off` stay strings (only `true`/`false` are
booleans). Every error names the file, line, column and key, and loading is all-or-nothing, so a broken file never
half-applies. Keys are never in the file: `api_key_env` names the environment variable that holds one. Relative
paths (`server.decision_log.path`, a local `engine.embedded.model` starting with `./`) are read against the
configuration file's folder, not the working directory.

An annotated file (every `server` key is optional):

```yaml
server:
  max_body_bytes: 4194304                             # larger requests get 413
  decision_timeout_s: 5.0                             # then on_engine_error decides
  media_hosts: [images.example.com]                   # http(s) media the engine may fetch; data URLs always pass
  max_media_bytes: 8388608
  max_media_items: 16                                 # images + videos a request may hand the engine; more: 413
  unknown_parts: refuse                               # or ignore: unreadable parts left out, x-d3-parts-ignored
  default_policy: auto                                # decides requests whose model names no policy
  passthrough: [/v1/embeddings]                       # other /v1 paths allowed through, undecided; default none
  admin_token_env: D3_ADMIN_TOKEN                     # enables POST /admin/reload
  decision_log: {path: decisions.jsonl, include_text: false}   # one JSON line per decision, no text by default
  drain_s: 5                                          # on SIGTERM: keep serving this long, /readyz 503
  grace_s: 30                                         # then in-flight requests and streams get this long
engine:
  embedded: {model: vllm-sr/d3-mini, timeout_s: 30}   # the default: vLLM inside the router's process
  # remote: {urls: [http://d3-a:8000, http://d3-b:8000], timeout_s: 2.0, api_key_env: D3_KEY}
  # pool: [{remote: {urls: [http://d3-a:8000], timeout_s: 1}}, {decisions: {url: https://h.example/v1, model: m}}]
  cache: {max_entries: 10000, ttl_s: 600}             # max_entries: 0 keeps no answers (single-flight stays)
  max_choice_options: 255                             # 26 for generative models (labels A..Z)
upstreams:
  small: {url: http://127.0.0.1:8001/v1, model: qwen3-8b}
  large: {url: https://api.example.com/v1, model: big-model, api_key_env: LARGE_API_KEY,
          max_connections: 256, pool_timeout_s: 1.0}  # its own pool; full for pool_timeout_s: 503 Retry-After
policies:
  auto: {...}                                         # keyed by the model name clients send
```

What the policy keys mean together (questions, `when`, rules, staged questions, tests) is told in
[policies.md](policies.md); this page lists every key.
"""

_PLACEHOLDER = {"upstreams": "NAME", "policies": "NAME", "questions": "ID"}
_BOUNDS = (
    ("minimum", ">="),
    ("exclusiveMinimum", ">"),
    ("maximum", "<="),
    ("exclusiveMaximum", "<"),
)
_SIZES = (
    ("minLength", "at least", "character"),
    ("maxLength", "at most", "character"),
    ("minItems", "at least", "item"),
    ("maxItems", "at most", "item"),
    ("minProperties", "at least", "entry"),
    ("maxProperties", "at most", "entry"),
)


def reference_markdown(schema: Schema) -> str:
    """Markdown describing every section and key of `schema` (a JSON Schema with `$defs`), ending in a newline.

    The same schema always gives the same text: sections and keys follow the schema's own order.
    """
    renderer = _Renderer(schema.get("$defs", {}))
    renderer.section((), schema)
    return _INTRO + "\n" + renderer.toc() + "\n" + "\n".join(renderer.sections)


class _Renderer:
    def __init__(self, defs: Schema) -> None:
        self.defs = defs
        self.sections: list[str] = []
        self.titles: list[tuple[int, str]] = []

    def resolve(self, node: Schema) -> Schema:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            resolved: Schema = self.defs[ref.removeprefix("#/$defs/")]
            return resolved
        return node

    def section(self, path: tuple[str, ...], node: Schema, variant: str | None = None) -> None:
        """One heading and key table for the object `node` at `path`, then the objects its keys hold."""
        node = self.resolve(node)
        heading = _heading(path, variant) if path else "The file's top level"
        self.titles.append((len(path), heading))
        lines = [f"## {heading}", ""]
        if node.get("description"):
            lines += [_sentence(node["description"]), ""]
        properties: Schema = node.get("properties", {})
        required = set(node.get("required", []))
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        children: list[tuple[tuple[str, ...], Schema, str | None]] = []
        for key, prop in properties.items():
            lines.append(self.row(key, prop, key in required, path))
            children += self.objects_under((*path, key), prop)
        self.sections.append("\n".join(lines) + "\n")
        for child_path, child, child_variant in children:
            self.section(child_path, child, child_variant)

    def objects_under(self, path: tuple[str, ...], prop: Schema) -> list[tuple[tuple[str, ...], Schema, str | None]]:
        """The objects a key holds, with the path each is written at: a mapping's values get a placeholder
        name (`NAME`), a list's items `[]`, and each branch of a `type`-tagged union its own section."""
        found: list[tuple[tuple[str, ...], Schema, str | None]] = []
        for branch in _branches(prop):
            target = self.resolve(branch)
            if "properties" in target:
                found.append((path, branch, _variant(target) if _is_union(prop) else None))
            elif isinstance(branch.get("additionalProperties"), dict):
                found += self.objects_under(_values(path), branch["additionalProperties"])
            elif isinstance(branch.get("items"), dict):
                found += self.objects_under(_items(path), branch["items"])
        return found

    def row(self, key: str, prop: Schema, required: bool, path: tuple[str, ...]) -> str:
        kind = self.type_of(prop, (*path, key))
        constraints = _constraints(prop)
        if constraints:
            kind += ", " + constraints
        if required:
            default = "required"
        elif "default" not in prop:
            default = "`[]`" if _json_type(prop) == "array" else "`{}`"
        elif isinstance(prop["default"], dict):
            default = "its keys' defaults" if prop["default"] else "`{}`"
        else:
            default = f"`{json.dumps(prop['default'])}`"
        description = prop.get("description") or self.resolve(_first_ref(prop)).get("description", "")
        return f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(_sentence(description))} |"

    def type_of(self, prop: Schema, path: tuple[str, ...]) -> str:
        """A key's type in words: `string`, `list of string`, `"a" or "b"`, a link to an object's section."""
        if "$ref" in prop:
            target = self.resolve(prop)
            if "properties" in target:
                return f"[object](#{_anchor(_heading(path, None))})"
            return self.type_of(target, path)
        if "enum" in prop:
            return " | ".join(f"`{json.dumps(value)}`" for value in prop["enum"])
        if "const" in prop:
            return f"`{json.dumps(prop['const'])}`"
        for union in ("anyOf", "oneOf"):
            if union in prop:
                if _is_union(prop):
                    variants = [self.resolve(branch) for branch in prop[union]]
                    return "object, by `type`: " + ", ".join(
                        f"[{_variant(target)}](#{_anchor(_heading(path, _variant(target)))})" for target in variants
                    )
                parts = [self.type_of(branch, path) for branch in prop[union]]
                return " or ".join(dict.fromkeys(parts))
        kind = _json_type(prop)
        if kind == "array" and isinstance(prop.get("items"), dict):
            return "list of " + self.type_of(prop["items"], _items(path))
        if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
            values = self.type_of(prop["additionalProperties"], _values(path))
            return f"mapping of name to {values}"
        if kind == "object":
            return "mapping"
        return kind or "any"

    def toc(self) -> str:
        lines = ["## Sections", ""]
        for depth, heading in self.titles:
            lines.append(f"{'  ' * max(depth - 1, 0)}- [{heading}](#{_anchor(heading)})")
        return "\n".join(lines) + "\n"


def _values(path: tuple[str, ...]) -> tuple[str, ...]:
    """Where a mapping's values are written: `upstreams` -> `upstreams.NAME`."""
    return (*path[:-1], f"{path[-1]}.{_PLACEHOLDER.get(path[-1], 'NAME')}")


def _items(path: tuple[str, ...]) -> tuple[str, ...]:
    """Where a list's items are written: `rules` -> `rules[]`."""
    return (*path[:-1], f"{path[-1]}[]")


def _branches(prop: Schema) -> list[Schema]:
    for union in ("anyOf", "oneOf"):
        if union in prop:
            return [branch for branch in prop[union] if isinstance(branch, dict)]
    return [prop]


def _is_union(prop: Schema) -> bool:
    """A union of objects told apart by their `type` key (the question kinds)."""
    return "discriminator" in prop


def _first_ref(prop: Schema) -> Schema:
    for branch in _branches(prop):
        if "$ref" in branch:
            return branch
    return {}


def _variant(target: Schema) -> str:
    tag = target.get("properties", {}).get("type", {})
    values = tag.get("enum") or [tag.get("const", target.get("title", "?"))]
    return f"type: {values[0]}"


def _json_type(prop: Schema) -> str:
    kind = prop.get("type", "")
    return kind if isinstance(kind, str) else " or ".join(kind)


def _constraints(prop: Schema) -> str:
    """The bounds of a key: `> 0`, `2 to 255` for an inclusive range, sizes in words; looked for in unions too."""
    for branch in _branches(prop):
        if branch is not prop and any(name in branch for name, *_ in _BOUNDS + _SIZES):
            return _constraints(branch)
    if "minimum" in prop and "maximum" in prop:
        words = [f"{prop['minimum']} to {prop['maximum']}"]
    else:
        words = [f"{op} {prop[name]}" for name, op in _BOUNDS if name in prop]
    words += [_size(bound, prop[name], unit) for name, bound, unit in _SIZES if name in prop]
    if "pattern" in prop:
        words.append(f"matching `{prop['pattern']}`")
    return ", ".join(words)


def _size(bound: str, count: int, unit: str) -> str:
    if count == 1 and bound == "at least":
        return "not empty"
    plural = unit if count == 1 else ("entries" if unit == "entry" else unit + "s")
    return f"{bound} {count} {plural}"


def _heading(path: tuple[str, ...], variant: str | None) -> str:
    name = f"`{'.'.join(path)}`"
    return f"{name}, `{variant}`" if variant else name


def _anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped but `-` and `_`, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if not text or text.endswith((".", "?", "!", ")")) else text + "."


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
