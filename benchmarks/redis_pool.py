"""Concurrent RedisStore calls against a redis-server of its own, by pool size (issue 24.4; router/_sessions/store.py's
docstring quotes it): for each round of `set` then `get` of C keys at once, the time, the calls Redis failed (and
which error) and the calls that found no free connection in time (busy).

    python -m benchmarks.redis_pool --calls 200 1000 --pools 32 64 128 256 --rounds 4 --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from typing import Any

import router._sessions.store as store_module
from router._observe.metrics import Metrics
from router._sessions.store import RedisStore
from tests.router._redis import RedisServer


class _Counting(RedisStore):
    """A store that also counts the failures by type."""

    kinds: collections.Counter[str]

    def _failed(self, op: str, exc: BaseException, *rest: Any) -> None:
        self.kinds[type(exc).__name__] += 1
        super()._failed(op, exc, *rest)


async def rounds(url: str, calls: int, pool: int, count: int, timeout_s: float) -> str:
    store = _Counting(url, timeout_s=timeout_s, metrics=Metrics(), max_connections=pool)
    store.kinds = collections.Counter()
    out = []
    try:
        for index in range(count):
            store.kinds.clear()
            busy = sum(store.busy[op]._child._value.get() for op in ("set", "get"))
            started = time.perf_counter()
            await asyncio.gather(*(store.set(f"k{i}", "v", 60) for i in range(calls)))
            await asyncio.gather(*(store.get(f"k{i}", 60) for i in range(calls)))
            took = time.perf_counter() - started
            busy = sum(store.busy[op]._child._value.get() for op in ("set", "get")) - busy
            out.append(f"r{index} {took * 1000:.0f} ms errors {dict(store.kinds) or 0} busy {busy:.0f}")
    finally:
        await store.aclose()
    return f"c={calls} pool={pool}: " + " | ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--pools", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=0.05)
    args = parser.parse_args()
    store_module.RETRY_S = 0.0  # probe at once after a failure, so that every round measures Redis
    server = RedisServer().start()
    try:
        for _ in range(args.repeat):
            for calls in args.calls:
                for pool in args.pools:
                    print(asyncio.run(rounds(server.url, calls, pool, args.rounds, args.timeout_s)), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
