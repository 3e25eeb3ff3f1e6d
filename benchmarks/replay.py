"""Replay throughput: `d3router replay`'s lines/s beside the router's own decision path, against the canned engine.

    python -m benchmarks.replay [--lines 3000] [--rounds 3] [--quick]

Both paths decide the same chat bodies (examples/traffic.jsonl's requests, repeated) under examples/routing.yaml's
policy, with a `RemoteEngine` talking to `benchmarks/_canned.py` (answers in microseconds) and the decision cache
off, so that every line costs one engine call on both paths. The router's path is what the app runs per request:
`RouterService.decide(policy, body)` from N concurrent callers; replay's is `router._offline.replay.replay` with
`--concurrency N` (reading, policy lookup, retry check and outcome bookkeeping added). Rounds alternate between
the two so that machine drift falls on both. Target: replay within 20% of the router's path at each concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._report import add_arguments, write
from d3backend import RemoteEngine, free_port
from policies import Config, parse_config
from router import RouterService
from router._offline.replay import TrafficLine, replay

REPO = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 64)


def config(url: str) -> Config:
    text = (REPO / "examples/routing.yaml").read_text(encoding="utf-8")
    start, end = text.index("engine:\n"), text.index("upstreams:")
    engine = f"engine:\n  remote: {{urls: ['{url}'], model: d3-tiny}}\n  cache: {{max_entries: 0}}\n\n"
    return parse_config(text[:start] + engine + text[end:], "benchmark.yaml")


def bodies(count: int) -> list[dict[str, Any]]:
    found = []
    for text in (REPO / "examples/traffic.jsonl").read_text(encoding="utf-8").splitlines():
        data = json.loads(text)
        found.append({**data.get("request", data), "model": "auto"})
    return [found[i % len(found)] for i in range(count)]


async def router_path(cfg: Config, engine: RemoteEngine, items: list[dict[str, Any]], concurrency: int) -> float:
    service = RouterService(cfg, engine)
    policy = cfg.policies["auto"]
    queue = iter(items)

    async def caller() -> None:
        for body in queue:
            await service.decide(policy, body)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - start


async def replay_path(cfg: Config, engine: RemoteEngine, items: list[dict[str, Any]], concurrency: int) -> float:
    lines = [TrafficLine(i + 1, body) for i, body in enumerate(items)]
    start = time.perf_counter()
    outcomes = await replay(cfg, lines, engine=engine, concurrency=concurrency)
    elapsed = time.perf_counter() - start
    if any(o.error is not None for o in outcomes):
        raise RuntimeError(f"the canned engine failed: {next(o.error for o in outcomes if o.error)}")
    return elapsed


async def measure(url: str, count: int, rounds: int) -> list[dict[str, Any]]:
    cfg = config(url)
    items = bodies(count)
    rows = []
    async with RemoteEngine([url], model="d3-tiny") as engine:
        await replay_path(cfg, engine, items[:50], 8)  # warm the pool
        for concurrency in LEVELS:
            seconds = {"router decision path": 0.0, "replay": 0.0}
            for _ in range(rounds):
                seconds["router decision path"] += await router_path(cfg, engine, items, concurrency)
                seconds["replay"] += await replay_path(cfg, engine, items, concurrency)
            base = count * rounds / seconds["router decision path"]
            for path, spent in seconds.items():
                rate = count * rounds / spent
                rows.append({"path": path, "concurrency": concurrency, "lines": count * rounds,
                             "lines/s": round(rate, 1), "vs router": f"{rate / base:.2f}"})  # fmt: skip
    return rows


def wait_for(url: str) -> None:
    for _ in range(100):
        try:
            httpx.get(f"{url}/v1/models", timeout=0.5)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"the canned engine at {url} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lines", type=int, default=3000, help="lines per path, concurrency and round")
    parser.add_argument("--rounds", type=int, default=3)
    add_arguments(parser)
    args = parser.parse_args()
    count, rounds = (64, 1) if args.quick else (args.lines, args.rounds)
    port = free_port()
    canned = subprocess.Popen([sys.executable, "-m", "benchmarks._canned", str(port)])
    try:
        wait_for(f"http://127.0.0.1:{port}")
        rows = asyncio.run(measure(f"http://127.0.0.1:{port}", count, rounds))
    finally:
        canned.terminate()
        canned.wait(10)
    command = "python -m benchmarks.replay" + (" --quick" if args.quick else f" --lines {count} --rounds {rounds}")
    print(write("replay", rows, ["path", "concurrency", "lines", "lines/s", "vs router"], command, args.results))


if __name__ == "__main__":
    main()
