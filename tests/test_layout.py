"""The packages' boundaries: imports only point downward, router -> policies -> d3backend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"d3backend": {"policies", "router"}, "policies": {"router"}, "router": set()}


def imported_packages(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_downward(package: str) -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(imported_packages(path) & FORBIDDEN[package])
        for path in (REPO / package).rglob("*.py")
    }
    assert {file: bad for file, bad in offenders.items() if bad} == {}


def test_vllm_is_imported_in_one_adapter_only() -> None:
    importers = sorted(
        str(path.relative_to(REPO))
        for package in FORBIDDEN
        for path in (REPO / package).rglob("*.py")
        if "vllm" in imported_packages(path)
    )
    assert importers in ([], ["d3backend/_vllm.py"])
