"""Time to first byte the router adds when its decision and the upstream's first token both take time (issue 31.4).

    python -m benchmarks.overlap [--requests 40] [--concurrency 4] [--engine-ms 40] [--first-ms 300] [--quick]

An upstream whose every answer waits `--first-ms` (a model's time to first token: benchmarks/_upstream.py
`--first-ms`), and two d3router processes with a fake engine taking `--engine-ms` a decision, no cache, on the same
policy (benchmarks/_overlaprows.py): one without overlap (`none`: the decision, then the upstream) and one with
`overlap: {when: always}` (the upstream starts while the engine decides), on the four client APIs (chat,
completions, Responses, Messages), plain and streamed. Each row: the first body byte's time directly and through
each router (p50, p99), and what each added (p50). The targets are loaded in turns (benchmarks/router.py
`interleaved`); the proxies have core 1, the upstream and the load generator core 0. Then a mix (half agreeing, a
quarter blocked, a quarter routed elsewhere) through both: time to first byte by kind, and from the overlap router's
/metrics the speculations by outcome and the share of upstream requests it cancelled; the wasted upstream time is
estimated as a cancelled request holding the upstream for about the decision, an answered one its first token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._answers import PATHS, request
from benchmarks._harness import PY, Target, _pin, interleaved, load, process
from benchmarks._overlaprows import BLOCKED, ELSEWHERE
from benchmarks._report import add_arguments, write
from d3backend import free_port

APIS = {**PATHS, "completions": "/v1/completions"}


def body(api: str, stream: bool, directory: Path) -> Path:
    """The request body for `api` in a file the load generator sends."""
    text = (json.dumps({"model": "auto", "stream": stream, "prompt": "Write a Python function that adds two numbers."})
            if api == "completions" else request(api, stream))  # fmt: skip
    path = directory / f"{api}-{'stream' if stream else 'plain'}.json"
    path.write_text(text, encoding="utf-8")
    return path


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _mix(url: str, requests: int, concurrency: int) -> dict[str, list[float]]:
    """Time to first body byte by kind, on a mix: half agreeing, a quarter blocked, a quarter routed elsewhere."""
    texts = {"agrees": "Write a haiku.", "blocked": f"{BLOCKED} now", "elsewhere": f"{ELSEWHERE}: a function"}
    kinds = ["agrees", "blocked", "agrees", "elsewhere"]
    times: dict[str, list[float]] = {kind: [] for kind in texts}
    queue = list(range(requests))
    async with httpx.AsyncClient(timeout=30) as client:

        async def worker() -> None:
            while queue:
                kind = kinds[queue.pop() % len(kinds)]
                sent = {"model": "auto", "messages": [{"role": "user", "content": texts[kind]}]}
                start = time.perf_counter()
                async with client.stream("POST", url, json=sent) as response:
                    async for _ in response.aiter_raw():
                        times[kind].append((time.perf_counter() - start) * 1000)
                        break

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times


def speculations(router: str) -> dict[str, float]:
    """The router's speculation counters by outcome (and `started`), from its /metrics."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{router}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "d3router_speculations_total":
                found[sample.labels["outcome"]] = found.get(sample.labels["outcome"], 0) + sample.value
            elif sample.name == "d3router_speculations_started_total":
                found["started"] = found.get("started", 0) + sample.value
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--requests", type=int, default=40, help="per target, API and mode, over all rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--engine-ms", type=float, default=40.0)
    parser.add_argument("--first-ms", type=float, default=300.0)
    args = parser.parse_args()
    requests, rounds = (8, 1) if args.quick else (args.requests, args.rounds)
    concurrency = min(args.concurrency, 2) if args.quick else args.concurrency
    work = Path(tempfile.mkdtemp(prefix="d3-bench-overlap-"))
    port = free_port()
    upstream = f"http://127.0.0.1:{port}/v1"
    rows: list[dict[str, Any]] = []
    routers = {"none": f"http://127.0.0.1:{free_port()}", "overlap": f"http://127.0.0.1:{free_port()}"}

    def argv(policy: str) -> list[str]:
        return [*_pin(1), PY, "-m", "benchmarks._proxy", "router", routers[policy].rsplit(":", 1)[1], upstream,
                "--engine", f"fake{args.engine_ms:g}ms",
                "--policy", "mix" if policy == "none" else "overlap"]  # fmt: skip

    with (
        process([*_pin(0), PY, "-m", "benchmarks._upstream", str(port), "--first-ms", str(args.first_ms)],
                f"{upstream}/chat/completions"),
        process(argv("none"), f"{routers['none']}{PATHS['chat']}"),
        process(argv("overlap"), f"{routers['overlap']}{PATHS['chat']}"),
    ):  # fmt: skip
        for router in routers.values():
            load(f"{router}{PATHS['chat']}", 2, 8)  # warm up
        for stream in (False, True):
            for api, path in APIS.items():
                sent = body(api, stream, work)
                direct = Target(f"direct {api}", f"{upstream}{path.removeprefix('/v1')}", stream=stream, body=sent)
                targets = [direct, *(Target(f"router {mode} {api}", f"{router}{path}", stream=stream, body=sent)
                                     for mode, router in routers.items())]  # fmt: skip
                measured = {row["target"]: row["_data"] for row in interleaved(targets, (concurrency,), requests,
                                                                                 rounds)}  # fmt: skip
                base = statistics.median(measured[direct.name]["ttfb_ms"])
                row: dict[str, Any] = {"api": api, "stream": stream, "requests": len(measured[direct.name]["ttfb_ms"]),
                                       "errors": sum(len(data["errors"]) for data in measured.values()),
                                       "direct ttfb p50 ms": base}  # fmt: skip
                for mode in routers:
                    ttfb = measured[f"router {mode} {api}"]["ttfb_ms"]
                    row[f"{mode}: ttfb p50 ms"] = statistics.median(ttfb)
                    row[f"{mode}: p99 ms"] = pct(ttfb, 0.99)
                    row[f"{mode}: added p50 ms"] = statistics.median(ttfb) - base
                rows.append(row)
        before = speculations(routers["overlap"])
        mixed = {mode: asyncio.run(_mix(f"{router}{PATHS['chat']}", 4 * max(requests // 4, 1), concurrency))
                 for mode, router in routers.items()}  # fmt: skip
        after = speculations(routers["overlap"])
    counts = {key: after.get(key, 0) - before.get(key, 0) for key in (*after, "started")}
    cancelled = sum(counts.get(key, 0) for key in ("blocked", "rerouted", "changed", "abandoned"))
    resent = counts.get("rerouted", 0) + counts.get("changed", 0)
    made = counts.get("started", 0) + resent  # upstream requests the overlap router made on the mix
    # Upstream time: a cancelled request held the upstream for about the decision; an answered one its first token.
    wasted_s = cancelled * args.engine_ms
    answered_s = (made - cancelled) * args.first_ms
    mix_rows = [{
        "kind": kind, "requests": len(mixed["overlap"][kind]),
        "none: ttfb p50 ms": statistics.median(mixed["none"][kind]),
        "overlap: ttfb p50 ms": statistics.median(mixed["overlap"][kind]),
    } for kind in mixed["overlap"]]  # fmt: skip
    summary = {"speculations": counts, "upstream requests": made, "cancelled": cancelled,
               "wasted request share": cancelled / made if made else float("nan"),
               "wasted upstream time share (est.)":
                   wasted_s / (wasted_s + answered_s) if made else float("nan")}  # fmt: skip
    columns = ["api", "stream", "requests", "errors", "direct ttfb p50 ms", "none: ttfb p50 ms", "none: p99 ms",
               "none: added p50 ms", "overlap: ttfb p50 ms", "overlap: p99 ms", "overlap: added p50 ms"]  # fmt: skip
    command = (f"python -m benchmarks.overlap --requests {requests} --rounds {rounds} --concurrency {concurrency} "
               f"--engine-ms {args.engine_ms:g} --first-ms {args.first_ms:g}")  # fmt: skip
    print(write("overlap", rows, columns, command, args.results))
    print(
        write(
            "overlap-mix",
            [*mix_rows, {"kind": "summary", **summary}],
            ["kind", "requests", "none: ttfb p50 ms", "overlap: ttfb p50 ms"],
            command,
            args.results,
        )
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
