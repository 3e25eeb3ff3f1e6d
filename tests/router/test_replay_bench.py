"""A quick run of the replay benchmark so it does not rot; CI times nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_replay_benchmark_runs(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.replay", "--quick", "--results", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads((tmp_path / "replay.json").read_text())["rows"]
    assert [(row["path"], row["concurrency"]) for row in rows] == [
        (path, level) for level in (1, 8, 64) for path in ("router decision path", "replay")
    ]
    assert all(row["lines"] == 64 and row["lines/s"] > 0 for row in rows)
