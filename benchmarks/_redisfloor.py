"""The floor under the router benchmark's Redis rows: one round trip to the benchmark's redis-server.

    python -m benchmarks._redisfloor redis://127.0.0.1:PORT/0 [--calls 3000]    # JSON: get, rate, rate_redis_py (ms)

A row with Redis (sessions, rate limits) adds at least one round trip to each request; what one costs on this
machine, measured the way the router makes it (on uvloop, one call at a time, from a process on the proxies' core),
is set beside the row's added p50 (benchmarks/_keyrows.py, benchmarks/_sessionrows.py): a `GET` from redis-py's
asyncio client (sessions: a read or write costs about as much), and the rate limit's own script
(router/_faces/limits.py: `EVALSHA`, two limits) through the store's pipelined connection (router/_sessions/pipe.py)
and, for comparison, from redis-py. p50 of `--calls` calls each, after 200 unmeasured; with the event loop's CPU a
call (`*_cpu`, process time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from redis.asyncio import Redis

from benchmarks._harness import _pin
from router._faces.limits import _SCRIPT
from router._sessions.pipe import Pipe

KEYS = ["d3:rate:{group:floor}:key:floor", "d3:rate:{group:floor}"]  # a key in a group: both limits, as the row's


def measure(url: str, calls: int = 3000, core: int = 1) -> dict[str, float]:
    """p50 ms of a GET and of the rate limit's script, measured in a process pinned to `core`."""
    argv = [*_pin(core), sys.executable, "-m", "benchmarks._redisfloor", url, "--calls", str(calls)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


async def _p50(call: Callable[[], Awaitable[Any]], calls: int) -> tuple[float, float]:
    """p50 ms of `call`, and the process's CPU ms a call."""
    for _ in range(200):
        await call()
    times = []
    cpu = time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 4), round((time.process_time() - cpu) / calls * 1000, 4)


async def _floor(url: str, calls: int) -> dict[str, float]:
    client = Redis.from_url(url, decode_responses=True, driver_info=None)
    pipe = Pipe(url, timeout_s=1.0)
    try:
        script = client.register_script(_SCRIPT)
        rate = ["1e-09", "0.999999999"] * 2  # 10^9 a second, as the row's: every call counted, none refused
        figures = {
            "get": await _p50(lambda: client.get(KEYS[1]), calls),
            "rate": await _p50(lambda: pipe.script(_SCRIPT, KEYS, [repr(time.time()), *rate]), calls),
            "rate_redis_py": await _p50(lambda: script(keys=KEYS, args=[repr(time.time()), *rate]), calls),
        }
    finally:
        await pipe.aclose()
        await client.aclose()
    return {
        **{name: ms for name, (ms, _) in figures.items()},
        **{f"{name}_cpu": cpu for name, (_, cpu) in figures.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    print(json.dumps(uvloop.run(_floor(args.url, args.calls))))


if __name__ == "__main__":
    main()
