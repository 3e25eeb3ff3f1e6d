"""benchmarks/staged.py runs (`--quick`, fake and canned engines) and its figures add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def test_staged_benchmark_quick(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.staged", "--quick", "--no-engine", "--results", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    rows = {(row["engine"], row["ask"]): row for row in json.loads((tmp_path / "staged.json").read_text())["rows"]}
    for engine in ("labelled (fake)", "canned (HTTP)"):
        together, staged = rows[(engine, "together")], rows[(engine, "staged")]
        assert together["questions/req"] == 4 and together["calls/req"] == 1
        assert 1 <= staged["calls/req"] <= 2
    # The labelled sample holds jailbreaks: those asked one question in one call; the canned engine never blocks.
    labelled = rows[("labelled (fake)", "staged")]
    assert labelled["questions/req"] < 4 and labelled["p50 ms, 1 call"] != ""
    assert rows[("canned (HTTP)", "staged")]["calls/req"] == 2
