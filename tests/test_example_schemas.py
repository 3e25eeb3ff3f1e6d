"""Every example configuration names the JSON Schema its editor should use, and the name resolves (issue 16)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda path: path.name)
def test_the_schema_modeline_resolves(example: Path) -> None:
    first = example.read_text(encoding="utf-8").splitlines()[0]
    match = MODELINE.match(first)
    assert match, f"{example.name} does not start with a yaml-language-server $schema modeline"
    target = (example.parent / match.group(1)).resolve()
    assert target == EXAMPLES / "d3router.schema.json", f"{example.name} points at {match.group(1)}"
