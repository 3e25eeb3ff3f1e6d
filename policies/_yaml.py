"""YAML reading that remembers where every key stands and refuses what pyyaml lets slip.

pyyaml silently keeps the last of two equal keys and reads `yes`, `no`, `on` and `off` as booleans (YAML 1.1).
This loader reports duplicate keys as errors and reads only `true`/`false` as booleans (YAML 1.2's core schema),
so an option called `yes` stays the string "yes". It returns the plain data and a map from each key path to its
1-based (line, column), which the validator uses to point at the offending key.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from policies._errors import ConfigError, Issue, Path

Marks = dict[Path, tuple[int, int]]

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


class _Loader(_Base):  # type: ignore[valid-type,misc]
    """A safe loader with YAML 1.2 booleans."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))


def _bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return str(node.value).lower() == "true"


_Loader.add_constructor("tag:yaml.org,2002:bool", _bool)


def load_yaml(text: str, file: str) -> tuple[Any, Marks]:
    """Parse `text`; raise `ConfigError` on a syntax error, a duplicate key or an empty document."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError([Issue(file, 1, None, (), "the file is empty; expected a mapping with `policies`")])
        marks: Marks = {}
        issues: list[Issue] = []
        _walk(node, (), marks, issues, file)
        if issues:
            raise ConfigError(issues)
        return loader.construct_document(node), marks
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError([Issue(file, line, column, (), f"invalid YAML: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Issue(file, None, None, (), f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()


def _walk(node: yaml.Node, path: Path, marks: Marks, issues: list[Issue], file: str) -> None:
    marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                issues.append(
                    Issue(
                        file,
                        line,
                        key_node.start_mark.column + 1,
                        (*path, key),
                        f"duplicate key {key!r} (first at line {seen[key]}); keep one",
                    )
                )
                continue
            seen[key] = line
            marks[(*path, key)] = (line, key_node.start_mark.column + 1)
            _walk(value_node, (*path, key), marks, issues, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), marks, issues, file)
