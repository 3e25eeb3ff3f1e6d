"""The router benchmark's usage rows (issue 29): what reading every answer's tokens, and budgets, add to a cache hit.

    python -m benchmarks.router --no-engine --only "d3router usage" [--rounds 3] [--requests 3000]

Four rows, plain and streamed, each the cache-hit row's proxy (benchmarks/_proxy.py `router --engine cache`), the
same request carrying the bench key (benchmarks/_keyrows.py):

- `OFF`     `count_usage: false`: nothing asked, nothing read
- `ON`      usage counted (the default): a JSON answer's `usage` read; a stream asked for its usage chunk (the canned
            upstream then sends it, as vLLM does) and the chunk cut out before the client
- `BUDGET`  counted, and the key's and its group's token budget and token rate in process (read before the
            decision, added to once the answer ended; never used up)
- `REDIS`   the same limits in the benchmark's own redis-server (one MGET before, one script after)

The facts-only policy's row (no engine call) is the router benchmark's own ("facts-only policy"). A row family
(benchmarks/_families.py): `rows(run)` measures, `summary(rows)` (`vs_off`) sets each row against its base.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from benchmarks import _keyrows, _sessionrows
from benchmarks._apirows import picked
from benchmarks._families import Run
from benchmarks._harness import _pin, interleaved
from benchmarks._targets import proxy

NAME = "usage"
COLUMNS: list[str] = []  # its figures are in its summary lines

OFF = "d3router usage off (cache hit)"
ON = "d3router usage counted (cache hit)"
BUDGET = "d3router usage, budgets in-process (cache hit)"
REDIS = "d3router usage, budgets in Redis (cache hit)"
BASE = ["router", "--engine", "cache", "--auth", "keys"]
ROWS = {
    OFF: [*BASE, "--usage", "off"],
    ON: BASE,
    BUDGET: ["router", "--engine", "cache", "--auth", "budget"],
    REDIS: ["router", "--engine", "cache", "--auth", "budget", "--redis", "redis"],
}
COMPARED = [(ON, OFF), (BUDGET, ON), (REDIS, ON)]  # (row, the row it is set against)


def _chosen(only: list[str]) -> list[str]:
    names = [name for name in ROWS if picked(only, name)]
    against = [base for row, base in COMPARED if row in names]
    return [name for name in ROWS if name in names or name in against]


def rows(run: Run) -> list[dict[str, Any]]:
    """Each chosen usage row and the rows it is set against, plain then streamed, loaded in turns."""
    chosen = _chosen(run.only)
    if not chosen:
        return []
    upstream, extra, levels, rounds = run.upstream, run.extra, run.levels, run.rounds
    requests = run.requests // 3 or 10
    out: list[dict[str, Any]] = []
    with ExitStack() as stack:
        redis = stack.enter_context(_sessionrows.redis_server(_pin(0))) if REDIS in chosen else ""
        for stream in (False, True):
            with ExitStack() as proxies:
                targets = [
                    proxy(proxies, "stream, " * stream + name, _sessionrows.with_redis(ROWS[name], redis), upstream,
                          extra, stream=stream, headers=(_keyrows.HEADER,))
                    for name in chosen
                ]  # fmt: skip
                out += interleaved(targets, levels, requests, rounds)
    return out


def vs_off(found: list[dict[str, Any]]) -> dict[str, str]:
    """A line per comparison whose two rows were measured: p50 and CPU per request added, at each concurrency."""
    by = {(row["target"], row["concurrency"]): row for row in found}
    lines: dict[str, str] = {}
    for prefix in ("", "stream, "):
        for name, against in COMPARED:
            parts = []
            for (target, level), row in sorted(by.items(), key=lambda item: item[0][1]):
                base = by.get((prefix + against, level))
                if target != prefix + name or base is None:
                    continue
                cpu = row.get("CPU ms/req"), base.get("CPU ms/req")
                cpu_part = (f", CPU {(cpu[0] - cpu[1]) * 1000:+.1f} us/req"
                            if isinstance(cpu[0], float) and isinstance(cpu[1], float) else "")  # fmt: skip
                parts.append(f"c={level}: p50 {row['p50 ms'] - base['p50 ms']:+.3f} ms{cpu_part}")
            if parts:
                errors = sum(row["errors"] for (target, _), row in by.items() if target == prefix + name)
                lines[f"usage: {prefix}{name}"] = (f"{prefix}{name} over {against}: " + "; ".join(parts)
                                                   + (f"; {errors} errors" if errors else ""))  # fmt: skip
    return lines


summary = vs_off
