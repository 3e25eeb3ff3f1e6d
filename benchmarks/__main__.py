"""Every benchmark, one after the other: `python -m benchmarks [--quick]`."""

from __future__ import annotations

import subprocess
import sys

MODULES = ("benchmarks.policy", "benchmarks.engine", "benchmarks.decisions", "benchmarks.router")

if __name__ == "__main__":
    for module in MODULES:
        print(f"== {module}", flush=True)
        subprocess.run([sys.executable, "-m", module, *sys.argv[1:]], check=True)
