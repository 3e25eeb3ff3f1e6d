"""What the Decisions API costs in the router, in process (no sockets: the router's own CPU, not the network's).

    python -m benchmarks.decisions [--quick]

Rows, one request at a time, median and p99 of each call: (1) a `DecisionsEngine` calling the local Decisions
server (tests/decisions_server.py, which also checks each request and answer against the `openai` SDK's types)
directly; (2) the same engine behind the router, asked through the router's own `POST /v1/decisions` with the cache
off (every call reaches the engine): the router's share is (2) - (1); (3) `POST /v1/decisions` answered from the
router's cache; (4) `POST /v1/decisions` with the cache off and a table engine that costs nothing (the face alone);
engine pools (issue 28, `FailoverEngine`), through `/v1/decisions` with the cache off: (5) the Decisions engine first
in a pool, answering (the pool's share is (5) - (2)); (6) behind a first engine that is down and set aside after its
first failure; (7) behind a first engine that fails every call and is never set aside (`set_aside_s: 0`: a failover
on every call); (8) the pool asked for the Decisions engine's own model (`POOL_MODEL`: that engine alone).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from benchmarks._report import add_arguments, write
from d3backend import (
    CachedEngine,
    Choice,
    DecisionEngine,
    DecisionsEngine,
    EngineUnavailable,
    FailoverEngine,
    FakeEngine,
    Noul,
    Score,
)
from policies import parse_config
from router import create_app
from tests.decisions_server import DecisionsServer

CONFIG = """
upstreams: {small: {url: "http://small.test/v1"}}
policies:
  auto:
    questions: {j: {type: noul}}
    rules: [{name: guard, when: j > 0.9, block: {}}, {name: default, route: small}]
"""
TABLE = {"jailbreak": 0.1, "kind": "code", "difficulty": 1.5}
QUESTIONS = {"jailbreak": Noul("Jailbreak?"), "kind": Choice("Kind?", {"code": None, "chat": None}),
             "difficulty": Score("How hard?", ("easy", "moderate", "hard"))}  # fmt: skip
BODY = {
    "model": "luna-test",
    "input": "Write a Python function that adds two numbers.",
    "questions": [
        {"type": "predicate", "name": "jailbreak", "instructions": "Jailbreak?"},
        {"type": "choice", "name": "kind", "instructions": "Kind?", "choices": [{"value": "code"}, {"value": "chat"}]},
        {"type": "score", "name": "difficulty", "instructions": "How hard?",
         "levels": [{"label": "easy"}, {"label": "moderate"}, {"label": "hard"}]},
    ],
}  # fmt: skip


async def timed(call: Callable[[], Awaitable[Any]], requests: int) -> dict[str, float]:
    for _ in range(max(requests // 10, 1)):  # warm-up
        await call()
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return {"p50 us": statistics.median(samples), "p99 us": samples[min(int(len(samples) * 0.99), len(samples) - 1)]}


def engine() -> DecisionsEngine:
    return DecisionsEngine("http://luna.test/v1", model="luna-test",
                           transport=httpx.ASGITransport(app=DecisionsServer(TABLE)))  # fmt: skip


def down(state: Any, questions: Any) -> dict[str, Any]:
    raise EngineUnavailable("down (the benchmark's first engine)")


def pool(first: str, set_aside_s: float = 5.0) -> FailoverEngine:
    """The Decisions engine in a pool: first (`first` "luna"), or behind an engine that is down."""
    backup = ("d3", FakeEngine(down, model="d3") if first != "luna" else FakeEngine(TABLE, model="d3"))
    members = [("luna", engine()), backup] if first == "luna" else [backup, ("luna", engine())]
    return FailoverEngine(members, set_aside_s=set_aside_s)


async def through_router(inner: DecisionEngine, cache: bool, requests: int, model: str = "luna-test"
                         ) -> dict[str, float]:  # fmt: skip
    app = create_app(parse_config(CONFIG), engine=CachedEngine(inner, max_entries=10_000 if cache else 0))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:

            async def call() -> None:
                response = await http.post("/v1/decisions", json={**BODY, "model": model})
                if response.status_code != 200:
                    raise RuntimeError(f"the router answered {response.status_code}: {response.text}")

            return await timed(call, requests)
    finally:
        await app.aclose()


async def run(requests: int) -> list[dict[str, Any]]:
    async with engine() as direct:
        rows = [{"target": "Decisions engine, direct", **await timed(lambda: direct.decide(BODY["input"], QUESTIONS),
                                                                    requests)}]  # fmt: skip
    rows.append({"target": "Decisions engine via the router's /v1/decisions (cache off)",
                 **await through_router(engine(), False, requests)})  # fmt: skip
    rows.append({"target": "/v1/decisions, cache hit",
                 **await through_router(FakeEngine(TABLE, model="luna-test"), True, requests)})  # fmt: skip
    rows.append({"target": "/v1/decisions, engine call (a table engine, cache off)",
                 **await through_router(FakeEngine(TABLE, model="luna-test"), False, requests)})  # fmt: skip
    for name, inner, model in (
        ("a pool, the Decisions engine first", pool("luna"), "pool(luna-test,d3)"),
        ("a pool, behind a first engine down (set aside)", pool("d3"), "pool(d3,luna-test)"),
        ("a pool, behind a first engine failing every call (set_aside_s 0)", pool("d3", 0.0), "pool(d3,luna-test)"),
        ("a pool asked for one engine's model", pool("d3"), "luna-test"),
    ):
        rows.append({"target": f"{name}, via /v1/decisions (cache off)", **await through_router(inner, False, requests,
                                                                                                model)})  # fmt: skip
    base = rows[0]["p50 us"]
    for row in rows:
        row["p50 vs direct us"] = row["p50 us"] - base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--requests", type=int, default=2000, help="calls per row")
    args = parser.parse_args()
    rows = asyncio.run(run(20 if args.quick else args.requests))
    columns = ["target", "p50 us", "p99 us", "p50 vs direct us"]
    print(write("decisions", rows, columns, "python -m benchmarks.decisions", args.results))


if __name__ == "__main__":
    main()
