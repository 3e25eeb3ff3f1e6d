"""Bounded memory: a burst of large bodies against `d3router serve`, with the default bounds and without them, side
by side; the router's peak RSS and what each request got.

    python -m benchmarks.memory [--clients 1000] [--mib 4] [--rounds 1] [--quick]

Each of `--clients` connections sends one POST of a `--mib` MiB chat body at once (raw sockets, one shared body
object on the client side), to a router whose policy blocks every request without asking an engine (so no upstream
holds bodies, and the router's own holding is what is measured). "bounded" runs with the defaults
(`server.max_concurrent_requests` 512, `server.max_buffered_bytes` 256 MiB); "unbounded" lifts both, as the router
was before they existed. Peak RSS is the process's high-water mark (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import peak_rss_mb, process
from benchmarks._report import add_arguments, write
from d3backend import free_port

CONFIG = """
server: {{max_body_bytes: {body_limit}{limits}}}
upstreams: {{up: {{url: "http://127.0.0.1:9/v1"}}}}
policies:
  auto:
    rules:
      - {{name: refuse, when: "true", block: {{status: 403, message: Measured.}}}}
      - {{name: default, route: up}}
"""
UNBOUNDED = ", max_concurrent_requests: 1000000, max_buffered_bytes: 1000000000000"


async def post(port: int, head: bytes, body: bytes) -> int:
    """One request on its own connection; the status, or 0 when the connection broke."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        try:
            writer.write(head)
            writer.write(body)
            await writer.drain()
            line = await reader.readline()
            return int(line.split()[1]) if line.startswith(b"HTTP/1.1") else 0
        finally:
            writer.close()
    except (OSError, ValueError, IndexError):
        return 0


async def burst(port: int, clients: int, mib: int) -> collections.Counter[int]:
    text = "x" * (mib * 1024 * 1024 - 200)
    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": text}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))  # fmt: skip
    statuses = await asyncio.gather(*(post(port, head, body) for _ in range(clients)))
    return collections.Counter(statuses)


def measure(name: str, limits: str, clients: int, mib: int, work: Path) -> dict[str, Any]:
    config = work / f"{name}.yaml"
    config.write_text(CONFIG.format(body_limit=(mib + 1) * 1024 * 1024, limits=limits), encoding="utf-8")
    port = free_port()
    argv = [sys.executable, "-m", "router", "serve", str(config), "--port", str(port), "--log-level", "warning"]
    with process(argv, f"http://127.0.0.1:{port}/healthz", log=work / f"{name}.log") as proc:
        idle = peak_rss_mb(proc.pid)
        start = time.perf_counter()
        statuses = asyncio.run(burst(port, clients, mib))
        elapsed = time.perf_counter() - start
        peak = peak_rss_mb(proc.pid)
    return {"target": name, "clients": clients, "body MiB": mib, "seconds": round(elapsed, 1),
            "idle RSS MB": round(idle, 1), "peak RSS MB": round(peak, 1),
            "403 (decided)": statuses.get(403, 0), "503 (bounded)": statuses.get(503, 0),
            "other": sum(n for status, n in statuses.items() if status not in (403, 503))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--unbounded-clients",
        type=int,
        default=None,
        help="clients for the unbounded row (default: --clients); fewer keeps a small machine alive",
    )
    args = parser.parse_args()
    clients, mib = (20, 1) if args.quick else (args.clients, args.mib)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):  # in turns: the machine's drift falls on both alike
            rows.append(measure("bounded (defaults)", "", clients, mib, Path(folder)))
            others = 20 if args.quick else (args.unbounded_clients or clients)
            rows.append(measure("unbounded (as before)", UNBOUNDED, others, mib, Path(folder)))
    columns = ["target", "clients", "body MiB", "seconds", "idle RSS MB", "peak RSS MB", "403 (decided)",
               "503 (bounded)", "other"]  # fmt: skip
    command = f"python -m benchmarks.memory --clients {clients} --mib {mib} --rounds {args.rounds}"
    command += f" --unbounded-clients {args.unbounded_clients}" if args.unbounded_clients else ""
    print(write("memory", rows, columns, command, args.results))


if __name__ == "__main__":
    main()
