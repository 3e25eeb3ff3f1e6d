"""Time to first byte the router adds when its decision and the upstream's first token both take time (issue 31.4).

    python -m benchmarks.overlap [--requests 40] [--concurrency 4] [--engine-ms 40] [--first-ms 300] [--quick]

An upstream whose every answer waits `--first-ms` (a model's time to first token: benchmarks/_upstream.py
`--first-ms`), and d3router with a fake engine taking `--engine-ms` a decision, no cache (benchmarks/_proxy.py
`--engine fakeNms`), on the four client APIs (chat, completions, Responses, Messages), plain and streamed. Each
row: the first body byte's time directly and through the router (p50, p99), and what the router added (p50). With
the decision made before the upstream is asked (today: no overlap exists yet), the router adds the whole decision,
about `--engine-ms`; with overlap (issue 31.1), a decision faster than the first token would add ~1-2 ms. The targets
are loaded in turns (benchmarks/router.py `interleaved`); the proxy has core 1, the upstream and the load
generator core 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._answers import PATHS, request
from benchmarks._report import add_arguments, write
from benchmarks.router import PY, Target, _pin, interleaved, load, process
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
    router_port = free_port()
    router = f"http://127.0.0.1:{router_port}"
    argv = [*_pin(1), PY, "-m", "benchmarks._proxy", "router", str(router_port), upstream, "--engine",
            f"fake{args.engine_ms:g}ms", "--sessions", "off"]  # fmt: skip
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(port), "--first-ms", str(args.first_ms)],
                 f"{upstream}/chat/completions"), process(argv, f"{router}{PATHS['chat']}"):  # fmt: skip
        load(f"{router}{PATHS['chat']}", 2, 8)  # warm up
        for stream in (False, True):
            for api, path in APIS.items():
                sent = body(api, stream, work)
                direct = Target(f"direct {api}", f"{upstream}{path.removeprefix('/v1')}", stream=stream, body=sent)
                routed = Target(f"router {api}", f"{router}{path}", stream=stream, body=sent)
                measured = {row["target"]: row["_data"] for row in interleaved([direct, routed], (concurrency,),
                                                                                 requests, rounds)}  # fmt: skip
                ttfb_direct, ttfb_router = measured[direct.name]["ttfb_ms"], measured[routed.name]["ttfb_ms"]
                rows.append({
                    "api": api, "stream": stream, "requests": len(ttfb_router),
                    "errors": sum(len(data["errors"]) for data in measured.values()),
                    "direct ttfb p50 ms": statistics.median(ttfb_direct),
                    "router ttfb p50 ms": statistics.median(ttfb_router),
                    "router ttfb p99 ms": pct(ttfb_router, 0.99),
                    "added p50 ms": statistics.median(ttfb_router) - statistics.median(ttfb_direct),
                    "overlap": "none (today)",
                })  # fmt: skip
    columns = ["api", "stream", "requests", "errors", "direct ttfb p50 ms", "router ttfb p50 ms", "router ttfb p99 ms",
               "added p50 ms", "overlap"]  # fmt: skip
    command = (f"python -m benchmarks.overlap --requests {requests} --rounds {rounds} --concurrency {concurrency} "
               f"--engine-ms {args.engine_ms:g} --first-ms {args.first_ms:g}")  # fmt: skip
    print(write("overlap", rows, columns, command, args.results))


if __name__ == "__main__":
    main()
