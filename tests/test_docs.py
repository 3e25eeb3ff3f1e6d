"""The documentation: the generated configuration reference is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from router._cli import config_schema, main

REPO = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--markdown"]) == 0
    printed = capsys.readouterr().out
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == printed, "run `d3router schema --markdown > docs/configuration.md`"
    assert printed.startswith("# Configuration reference\n")
    assert "`upstreams.NAME`" in printed and config_schema()["title"] == "d3-router configuration"
