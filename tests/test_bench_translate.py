"""The router benchmark's translation rows (benchmarks/_translaterows.py, issue 30) run and are set against their
native rows."""

from __future__ import annotations

from pathlib import Path

from tests.test_benchmarks import run

PAIRS = ["translated, Messages client to a Chat upstream", "translated, Chat client to a Messages upstream",
         "translated, Responses client to a Chat upstream", "translated, Chat client to a Responses upstream"]  # fmt: skip


def test_translated_rows_run_against_native_ones(tmp_path: Path) -> None:
    payload = run("benchmarks.router", tmp_path, "--no-engine", "--only", "translated", "--requests", "200")
    rows = payload["rows"]
    translated = [row for row in rows if row["target"].removeprefix("stream, ").startswith("translated, ")]  # type: ignore[union-attr,index]
    assert {row["target"] for row in translated} == {*PAIRS, *(f"stream, {name}" for name in PAIRS)}  # type: ignore[index]
    assert len(translated) == 16  # c=1 and 8 each
    assert all(row["errors"] == 0 and row["rps vs native"] > 0 for row in translated)  # type: ignore[index]
    assert all(row["first byte p50 ms"] > 0 and row["first byte vs native"] > 0 for row in translated)  # type: ignore[index]
    natives = {row["target"] for row in rows if "(native, vs translated)" in row["target"]}  # type: ignore[index,operator]
    assert natives == {f"{prefix}{name} (native, vs translated)" for prefix in ("", "stream, ")
                       for name in ("messages cache hit", "d3router cache hit", "responses cache hit")}  # fmt: skip
    assert all(row["errors"] == 0 for row in rows)  # type: ignore[index]
    text = (tmp_path / "router.md").read_text()
    assert "- stream, translated, Responses client to a Chat upstream: c=1: " in text
    assert "- translated, Chat client to a Responses upstream: c=1: " in text


def test_responses_translated_rows_alone(tmp_path: Path) -> None:
    """`--only Responses` measures the two Responses pairs with their native rows, one native row per client API."""
    payload = run("benchmarks.router", tmp_path, "--no-engine", "--only", "translated, Responses", "--only",
                  "translated, Chat client to a Responses")  # fmt: skip
    targets = {row["target"] for row in payload["rows"]}  # type: ignore[index,union-attr]
    assert {name for name in targets if "translated" in name} == {
        f"{prefix}{name}" for prefix in ("", "stream, ")
        for name in ("translated, Responses client to a Chat upstream",
                     "translated, Chat client to a Responses upstream",
                     "responses cache hit (native, vs translated)", "d3router cache hit (native, vs translated)")
    }  # fmt: skip
