"""The router benchmark's session rows (issue 12): the cache-hit row again with sessions, in-process and in Redis.

The bench policy is `session: {mode: sticky}` in those rows and `{mode: off}` in every other d3router row
(benchmarks/_proxy.py `--sessions`), so that the difference is what sessions add. Each request is the load
generator's own chat body, one user turn, with no session id: its session is the fingerprint of that identical
opening (system prompt and first user turn, with the client's credential hashed in), found from the body on every
request. An opening turn is decided anew and its route written to the store (Redis: one SET with its TTL). The
"later turns" rows send a conversation's third turn instead: its session, found by the same opening, is read from
the store (one GETEX, the read and the TTL's restart in one round trip) and the turn goes where it says ("sticky").

`redis_server(pin)` starts a redis-server of the benchmark's own on a free port (no persistence) and stops it by
its PID; `vs_cache_hit(rows)` fills each session row's added p50 over the plain cache-hit row at the same
concurrency and returns a summary line per session row, with the issue's target at c=1.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from benchmarks._loadgen import PROMPT
from d3backend import free_port

PLAIN = "d3router cache hit"
LATER = ", later turns"
# Row name: (its `--sessions` spec, "redis" standing for the benchmark's own server; the added p50 at c=1 aimed at).
ROWS = {
    f"{PLAIN}, sessions in-process": ("memory", 0.05),
    f"{PLAIN}, sessions in Redis": ("redis", 0.3),
    f"{PLAIN}, sessions in-process{LATER}": ("memory", 0.05),
    f"{PLAIN}, sessions in Redis{LATER}": ("redis", 0.3),
}
COLUMN = "added p50 vs cache hit ms"


@functools.cache
def body(name: str) -> Path | None:
    """The request body of a session row: the load generator's own (an opening turn) or, for a "later turns" row,
    a third turn of the same conversation, whose session is found by its opening and read from the store."""
    if not name.endswith(LATER):
        return None
    messages = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "def add(a, b): return a + b"},
                {"role": "user", "content": "Thanks; now add type hints."}]  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="d3-bench-body-")) / "later.json"
    path.write_text(json.dumps({"model": "auto", "stream": False, "messages": messages}), encoding="utf-8")
    return path


def base(only: list[str], name: str) -> bool:
    """Whether `name` is the plain cache-hit row and `--only` measures a session row, which is set against it."""
    return name == PLAIN and any(part in row for part in only for row in ROWS)


def spec(name: str) -> list[str]:
    """The `benchmarks._proxy` arguments of a session row."""
    return ["router", "--engine", "cache", "--sessions", ROWS[name][0]]


def with_redis(spec: list[str], url: str) -> list[str]:
    """`spec` with the benchmark's Redis URL in place of "redis"."""
    return [url if part == "redis" else part for part in spec]


def needs_redis(spec: list[str]) -> bool:
    return "redis" in spec


@contextmanager
def redis_server(pin: list[str], timeout_s: float = 30.0) -> Iterator[str]:
    """A redis-server of the benchmark's own on a free port, without persistence, run under `pin` (taskset);
    yields its URL, then stops it by its PID."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (the Redis sessions row needs it): run `bash .ci/setup`, "
                         "which installs Debian's redis-server, or leave the row out with --only")  # fmt: skip
    port = free_port()
    argv = [*pin, binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with Redis(port=port, socket_timeout=1) as client:
                    client.ping()
                break
            except (OSError, RedisError):  # not up yet
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def vs_cache_hit(rows: list[dict[str, Any]], counts: dict[str, dict[str, int]] | None = None,
                 floor: dict[str, float] | None = None) -> dict[str, str]:  # fmt: skip
    """Fill each session row's `COLUMN` (its p50 less the plain cache-hit row's, same concurrency); return a line
    per session row: the added p50 at each concurrency, the target at c=1, from `counts` (what each proxy printed
    as it stopped) the turns Redis left to the in-process store, if any, and for a Redis row the `floor` measured
    beside it (benchmarks/_redisfloor.py: one GET's round trip from redis-py)."""
    plain = {row["concurrency"]: row for row in rows if row["target"] == PLAIN}
    found: dict[str, list[tuple[int, float]]] = {}
    cpu: dict[str, list[float]] = {}  # the steadier figure on these shared cores: CPU per request, added
    for row in rows:
        base = plain.get(row["concurrency"])
        if row["target"] not in ROWS or base is None:
            continue
        row[COLUMN] = row["p50 ms"] - base["p50 ms"]
        found.setdefault(row["target"], []).append((row["concurrency"], row[COLUMN]))
        if isinstance(row.get("CPU ms/req"), float) and isinstance(base.get("CPU ms/req"), float):
            cpu.setdefault(row["target"], []).append(row["CPU ms/req"] - base["CPU ms/req"])
    lines = {}
    for name, added in found.items():
        target = ROWS[name][1]
        at_1 = next((value for level, value in added if level == 1), None)
        verdict = "" if at_1 is None else f" ({'met' if at_1 <= target else 'MISSED'})"
        errors = sum(row["errors"] for row in rows if row["target"] == name)
        fallbacks = (counts or {}).get(name, {}).get("redis_fallbacks", 0)
        lines[name] = (
            f"{name}: adds p50 ms {', '.join(f'{value:+.3f}' for _, value in added)} over {PLAIN} at "
            f"c={'/'.join(str(level) for level, _ in added)}; target <= {target} ms at c=1{verdict}"
            + (f"; CPU ms per request {', '.join(f'{value:+.3f}' for value in cpu[name])}" if name in cpu else "")
            + (f"; {errors} errors" if errors else "")
            + (f"; {fallbacks} store calls fell back from Redis to the in-process store" if fallbacks else "")
        )
        if floor and ROWS[name][0] == "redis":
            lines[name] += f"; one GET's round trip from redis-py at c=1: {floor['get']:.3f} ms p50"
    return lines
