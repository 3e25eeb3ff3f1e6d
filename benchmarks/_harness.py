"""The router benchmark's harness: processes run until a context ends, the load generator, and targets loaded in
turns (`interleaved`), with the CPU time, peak memory and garbage collections of the processes each target counts.

    with process(argv, ready_url) as proc: ...       # started, ready, stopped by SIGINT
    rows = interleaved([Target(name, url, pids)], levels=(1, 8), requests=3000, rounds=3)

Every benchmark that loads HTTP targets (benchmarks/router.py and its row families, overlap.py, tracing.py, soak.py,
...) uses these; benchmarks/router.py re-exports them for the modules that still import them from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

PY = sys.executable
CORES = os.cpu_count() or 1
TICKS = os.sysconf("SC_CLK_TCK")
STATE = "Write a Python function that adds two numbers."  # what benchmarks._loadgen asks


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core % CORES)] if CORES > 1 else []


@contextmanager
def process(
    argv: list[str],
    ready_url: str | None,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    log: Path | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """Run `argv` until the context ends (SIGINT), once `ready_url` answers; its stdout is a pipe read as it stops,
    or, with `log`, that file with its stderr too (a chatty process must not fill a pipe nobody reads meanwhile)."""
    with log.open("w", encoding="utf-8") if log else contextlib.nullcontext() as out:
        proc = subprocess.Popen(argv, stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT if out else
                                subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})}, cwd=cwd)  # fmt: skip
    started = False
    try:
        if ready_url:
            _wait_ready(proc, argv, ready_url, timeout_s)
        started = True
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not started and proc.stdout:  # nobody will read it
            proc.stdout.close()


def _wait_ready(proc: subprocess.Popen[str], argv: list[str], ready_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.post(ready_url, content=b"{}", timeout=1)
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{argv} did not start") from None
            time.sleep(0.1)
            continue
        if proc.poll() is not None:  # it died, and something else answered on its port
            raise RuntimeError(f"{argv} exited with {proc.returncode}; something else answers {ready_url}")
        return


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def load(
    url: str, concurrency: int, requests: int, *, stream: bool = False, body: Path | None = None,
    headers: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    argv = [*_pin(0), PY, "-m", "benchmarks._loadgen", url, "--concurrency", str(concurrency),
            "--requests", str(requests), *(arg for header in headers for arg in ("--header", header))]  # fmt: skip
    if stream:
        argv.append("--stream")
    if body is not None:
        argv += ["--body", str(body)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def summarize(name: str, concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    latencies = sorted(result["latency_ms"])

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "target": name, "concurrency": concurrency, "requests": len(latencies), "errors": len(result["errors"]),
        "rps": len(latencies) / result["elapsed_s"], "p50 ms": statistics.median(latencies), "p95 ms": pct(0.95),
        "p99 ms": pct(0.99), "p99.9 ms": pct(0.999), "max ms": latencies[-1],
    }  # fmt: skip


def gc_window(url: str | None) -> dict[str, Any] | None:
    """The proxy's garbage collections since the last call (benchmarks/_proxy.py `GET /_gc`), or None."""
    return httpx.get(url, timeout=10).json() if url else None  # type: ignore[no-any-return]


def gc_columns(data: dict[str, Any], requests: int) -> dict[str, Any]:
    """A row's garbage collection columns: collections per generation, full ones per 10,000 requests, the longest
    pause (issue 31.5)."""
    counts = data["gc"]["collections"]
    return {"gc 0/1/2": "/".join(str(n) for n in counts), "full gc per 10k": 10_000 * counts[2] / max(requests, 1),
            "gc longest ms": data["gc"]["longest pause ms"]}  # fmt: skip


@dataclass
class Target:
    """One thing to load: its URL, and the processes whose CPU time and peak memory count as its own."""

    name: str
    url: str
    pids: Callable[[], list[int]] = list
    stream: bool = False
    body: Path | None = None
    gc: str | None = None  # the proxy's `GET /_gc` (benchmarks/_proxy.py), for its garbage collection columns
    headers: tuple[str, ...] = ()  # request headers the load generator sends (benchmarks/_keyrows.py: the key)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return total


def interleaved(targets: list[Target], levels: tuple[int, ...], requests: int, rounds: int) -> list[dict[str, Any]]:
    """Load every target at each concurrency in turns, `rounds` times, so that the machine's drift (10-40% between
    minutes here) falls on all of them alike; each round starts one target further, so that none always follows
    the same one. Each row merges its rounds."""
    rows = []
    for concurrency in levels:
        merged: dict[str, dict[str, Any]] = {
            t.name: {
                "latency_ms": [],
                "ttfb_ms": [],
                "gaps_ms": [],
                "errors": [],
                "elapsed_s": 0.0,
                "cpu_s": 0.0,
                "gc": {"collections": [0, 0, 0], "longest pause ms": 0.0},
            }
            for t in targets
        }
        for turn in range(rounds):
            for target in targets[turn % len(targets) :] + targets[: turn % len(targets)]:  # each leads in turn
                before = cpu_seconds(target.pids())
                gc_window(target.gc)  # collections from here on
                result = load(target.url, concurrency, max(requests // rounds, 1), stream=target.stream,
                              body=target.body, headers=target.headers)  # fmt: skip
                into = merged[target.name]
                into["cpu_s"] += cpu_seconds(target.pids()) - before
                collected = gc_window(target.gc)
                if collected is not None:
                    into["gc"] = {"collections": [a + b for a, b in zip(into["gc"]["collections"],
                                                                        collected["collections"], strict=True)],
                                  "longest pause ms": max(into["gc"]["longest pause ms"],
                                                          collected["longest pause ms"])}  # fmt: skip
                for key in ("latency_ms", "ttfb_ms", "gaps_ms", "errors"):
                    into[key] += result[key]
                into["elapsed_s"] += result["elapsed_s"]
        for target in targets:
            data = merged[target.name]
            row = summarize(target.name, concurrency, data)
            pids = target.pids()
            if pids:
                row["CPU ms/req"] = 1000 * data["cpu_s"] / row["requests"]
                row["peak RSS MB"] = round(max(peak_rss_mb(pid) for pid in pids), 1)
            if target.gc:
                row.update(gc_columns(data, row["requests"]))
            row["_data"] = data
            rows.append(row)
    order = [target.name for target in targets]
    return sorted(rows, key=lambda row: (order.index(row["target"]), row["concurrency"]))


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                pids += _tree(int(child))
    return pids
