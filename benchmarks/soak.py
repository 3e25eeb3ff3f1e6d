"""A bounded soak: many requests at concurrency 64, streamed and not, through d3router with a fake engine and a
fast upstream. Checks zero errors, the router's memory between the first and last quarter, and that its sockets
return to their idle count afterwards.

    python -m benchmarks.soak [--requests 20000] [--concurrency 64]

Exit status 1 when a check fails; the figures go to `benchmarks/results/soak.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from benchmarks._harness import PY, _pin, peak_rss_mb, process
from benchmarks._report import add_arguments, write
from d3backend import free_port


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += fd.readlink().name.startswith("socket:")
        except OSError:
            continue
    return count


def tasks(port: int) -> int:
    """The asyncio tasks alive in the proxy (its `/_tasks` answer counts the task answering it too)."""
    return int(httpx.get(f"http://127.0.0.1:{port}/_tasks", timeout=5).text)


def leave_early(count: int) -> dict[str, float]:
    """`count` streams abandoned after their first chunk, against an upstream whose streams last 25 s: the router
    must close each upstream request when its client leaves, so its sockets are back to idle within seconds
    (a leaked upstream request would hold its connection for the rest of those 25 s)."""
    up_port, port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(up_port), "--gap-ms", "5000"],
                 f"{upstream}/chat/completions"), \
            process([*_pin(1), PY, "-m", "benchmarks._proxy", "router", str(port), upstream, "--engine", "fake"],
                    url) as router:  # fmt: skip
        before, rss_before, tasks_before = sockets(router.pid), rss_mb(router.pid), tasks(port)
        out = subprocess.run(
            [
                *_pin(0),
                PY,
                "-m",
                "benchmarks._loadgen",
                url,
                "--concurrency",
                "16",
                "--requests",
                str(count),
                "--leave-early",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        )
        result = json.loads(out.stdout)
        deadline = time.monotonic() + 8
        while (after := sockets(router.pid)) > before and time.monotonic() < deadline:
            time.sleep(0.5)
        return {
            "disconnects": len(result["latency_ms"]),
            "disconnect errors": len(result["errors"]),
            "sockets before disconnects": before,
            "sockets after disconnects": after,
            "tasks before disconnects": tasks_before,
            "tasks after disconnects": tasks(port),
            "RSS before disconnects MB": round(rss_before, 1),
            "RSS after disconnects MB": round(rss_mb(router.pid), 1),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--disconnects", type=int, default=1000, help="streams the client abandons mid-way")
    args = parser.parse_args()
    requests = 2_000 if args.quick and args.requests == 20_000 else args.requests
    streamed_share = 4  # one connection in four streams
    up_port, port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(up_port)], f"{upstream}/chat/completions"), \
            process([*_pin(1), PY, "-m", "benchmarks._proxy", "router", str(port), upstream, "--engine", "fake"],
                    url) as router:  # fmt: skip
        idle_sockets = sockets(router.pid)
        samples: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.25):
                samples.append(rss_mb(router.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        streamed_c = max(1, args.concurrency // streamed_share)
        streamed_n = requests // streamed_share
        start = time.monotonic()
        jobs = [
            subprocess.Popen([*_pin(0), PY, "-m", "benchmarks._loadgen", url, "--concurrency",
                              str(args.concurrency - streamed_c), "--requests", str(requests - streamed_n)],
                             stdout=subprocess.PIPE, text=True),
            subprocess.Popen([*_pin(0), PY, "-m", "benchmarks._loadgen", url, "--concurrency", str(streamed_c),
                              "--requests", str(streamed_n), "--stream"], stdout=subprocess.PIPE, text=True),
        ]  # fmt: skip
        results = [json.loads(job.communicate(timeout=1800)[0]) for job in jobs]
        elapsed = time.monotonic() - start
        done.set()
        sampler.join()
        # Pooled upstream connections close once their 5 s keep-alive expires (aiohttp sweeps every 5 s); leaked
        # ones never do.
        deadline = time.monotonic() + 15
        while (after_sockets := sockets(router.pid)) > idle_sockets and time.monotonic() < deadline:
            time.sleep(0.5)
        peak = peak_rss_mb(router.pid)
    left = leave_early(args.disconnects if not args.quick else 200)
    served = sum(len(result["latency_ms"]) for result in results)
    errors = sum(len(result["errors"]) for result in results)
    quarter = max(1, len(samples) // 4)
    first, last = statistics.mean(samples[:quarter]), statistics.mean(samples[-quarter:])
    growth = (last - first) / first * 100
    row = {
        "requests": served, "streamed": len(results[1]["latency_ms"]), "concurrency": args.concurrency,
        "errors": errors, "seconds": round(elapsed, 1), "rps": round(served / elapsed),
        "RSS first quarter MB": round(first, 1), "RSS last quarter MB": round(last, 1),
        "RSS growth %": round(growth, 2), "peak RSS MB": round(peak, 1),
        "sockets idle before": idle_sockets, "sockets idle after": after_sockets,
        **left,
    }  # fmt: skip
    print(write("soak", [row], list(row), "python -m benchmarks.soak", args.results))
    failures = []
    if errors or served != requests:
        failures.append(f"{errors} errors, {served} of {requests} requests served")
    if not args.quick and growth >= 10:
        failures.append(f"RSS grew {growth:.1f}% between the first and last quarter")
    if after_sockets > idle_sockets:
        failures.append(f"{after_sockets - idle_sockets} sockets still open after the load")
    if (
        left["disconnect errors"]
        or left["sockets after disconnects"] > left["sockets before disconnects"]
        or left["tasks after disconnects"] > left["tasks before disconnects"]
    ):
        failures.append(f"after {left['disconnects']} abandoned streams: {left}")
    for failure in failures:
        print(f"soak: FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
