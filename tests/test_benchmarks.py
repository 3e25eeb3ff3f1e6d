"""Quick runs of the benchmark harness so it does not rot; CI times nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_vllm

REPO = Path(__file__).resolve().parents[1]


def run(module: str, results: Path, *extra: str) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--results", str(results), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    name = module.rsplit(".", 1)[1]
    assert (results / f"{name}.md").read_text().startswith("| ")
    payload: dict[str, object] = json.loads((results / f"{name}.json").read_text())
    return payload


def test_policy_benchmark_runs(tmp_path: Path) -> None:
    payload = run("benchmarks.policy", tmp_path)
    assert [row["measure"] for row in payload["rows"]] == [  # type: ignore[index,union-attr]
        "evaluate a 20-rule policy (all rules tried)",
        "load a 64-question, 100-rule file",
    ]


@pytest.mark.engine
def test_engine_benchmark_runs(tmp_path: Path) -> None:
    require_vllm()
    payload = run("benchmarks.engine", tmp_path)
    clients = [row["client"] for row in payload["rows"]]  # type: ignore[index,union-attr]
    pair = ["raw httpx", "raw httpx, aiohttp pool", "RemoteEngine"]
    assert clients == [*pair, *pair, "CachedEngine hit"]


def test_router_benchmark_runs(tmp_path: Path) -> None:
    payload = run("benchmarks.router", tmp_path, "--no-engine")
    rows = payload["rows"]
    assert {row["target"] for row in rows} >= {"direct", "pass-through, httpx pool", "d3router cache hit"}  # type: ignore[union-attr,index]
    assert all(row["errors"] == 0 for row in rows)  # type: ignore[union-attr,index]
    extra = json.loads((tmp_path / "router-extra.json").read_text())
    assert extra["streaming"]["d3router"]["errors"] == 0
    calls = extra["engine_calls"]["d3router fake engine 10 ms"]
    assert calls["engine_calls"] == calls["decided_requests"] > 0  # one engine call per uncached request


def test_soak_small(tmp_path: Path) -> None:
    """The soak at 2,000 requests: zero errors and no sockets left open (memory growth is judged on full runs)."""
    completed = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--quick", "--results", str(tmp_path)],
                               cwd=REPO, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "| 2000 |" in completed.stdout
    assert "| 2000 |" in (tmp_path / "soak.md").read_text()  # the figures went to this test's own folder
