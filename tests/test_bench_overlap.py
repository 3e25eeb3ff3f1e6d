"""The router benchmark's overlap rows (benchmarks/_overlaprouterrows.py, issue 31.4): the first byte added with and
without overlap, side by side, on the four client APIs, plain and streamed."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.test_benchmarks import run

APIS = ("Chat", "Responses", "Messages", "Completions")  # as the rows spell them: `--only messages` picks none
TARGETS = ("upstream direct", "d3router, no overlap", "d3router, overlap")


def test_overlap_rows_run_side_by_side(tmp_path: Path) -> None:
    payload = run("benchmarks.router", tmp_path, "--no-engine", "--only", "overlap")
    rows = [row for row in payload["rows"] if "overlap, " in row["target"]]  # type: ignore[index,union-attr,operator]
    names = [f"{prefix}overlap, {api}: {target}" for prefix in ("", "stream, ") for api in APIS for target in TARGETS]
    assert [row["target"] for row in rows] == [name for name in names for _ in (1, 8)]  # type: ignore[index]
    assert all(row["errors"] == 0 and row["requests"] == 4 for row in rows)  # type: ignore[index]
    for row in rows:
        added = row.get("first byte added p50 ms")  # type: ignore[union-attr]
        if row["target"].endswith("upstream direct"):  # type: ignore[index,union-attr]
            assert added is None  # the upstream's own first byte is what the routers' are set against
            continue
        assert isinstance(added, float) and math.isfinite(added), row
        if row["target"].endswith("no overlap"):  # type: ignore[index,union-attr]
            assert added > 0 and "added vs no overlap" not in row, row  # type: ignore[operator]
        else:  # the overlap row is set against the no-overlap row of its API at its concurrency
            assert math.isfinite(row["added vs no overlap"]), row  # type: ignore[index,arg-type]
    extra = json.loads((tmp_path / "router-extra.json").read_text())
    assert set(extra["overlap"]) == {f"{prefix}overlap, {api}" for prefix in ("", "stream, ") for api in APIS}
    speculated = extra["overlap speculations"]  # every request of the overlap router speculated, and agreed
    assert speculated["d3router, no overlap"] == {}
    overlapped = speculated["d3router, overlap"]
    assert overlapped.get("started", 0) == overlapped.get("used", 0) >= 4 * 2 * 8  # 4 requests, c=1 and 8, 8 rows
    text = (tmp_path / "router.md").read_text()
    assert "- stream, overlap, Messages (fake engine 40 ms, upstream first token 300 ms): c=1: first byte added" in text
    assert "| first byte added p50 ms | added vs no overlap |" in text
