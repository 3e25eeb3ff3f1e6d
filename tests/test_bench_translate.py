"""The router benchmark's translation rows (benchmarks/_translaterows.py, issue 30) run and are set against their
native rows."""

from __future__ import annotations

from pathlib import Path

from tests.test_benchmarks import run


def test_translated_rows_run_against_native_ones(tmp_path: Path) -> None:
    payload = run("benchmarks.router", tmp_path, "--no-engine", "--only", "translated", "--requests", "200")
    rows = payload["rows"]
    translated = [row for row in rows if row["target"].removeprefix("stream, ").startswith("translated, ")]  # type: ignore[union-attr,index]
    assert {row["target"] for row in translated} == {  # type: ignore[index]
        "translated, Messages client to a Chat upstream", "translated, Chat client to a Messages upstream",
        "stream, translated, Messages client to a Chat upstream", "stream, translated, Chat client to a Messages upstream"}  # fmt: skip
    assert all(row["errors"] == 0 and row["rps vs native"] > 0 for row in translated)  # type: ignore[index]
    assert all(row["first byte p50 ms"] > 0 for row in translated)  # type: ignore[index]
    assert "first byte" in (tmp_path / "router.md").read_text()
