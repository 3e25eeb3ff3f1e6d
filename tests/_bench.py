"""What the benchmark tests share: the quick router benchmark run as a process, and the redis-server it needs.

require_redis_server()                                  # at import: a missing install fails, never skips
completed = bench(tmp_path, "--only", "d3router usage")  # results in tmp_path/router.json
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def require_redis_server() -> None:
    """Fail (never skip) when redis-server is not installed: the Redis rows run for real."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; run `bash .ci/setup` (it installs Debian's redis-server)",
                    pytrace=False)  # fmt: skip


def bench(results: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.router --quick --no-engine` with `extra`, its files written to `results`."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.router", "--quick", "--no-engine", "--results", str(results), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
