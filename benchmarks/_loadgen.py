"""A small HTTP/1.1 load generator on raw asyncio streams, cheap enough not to be the bottleneck.

    python -m benchmarks._loadgen URL --concurrency 8 --requests 3000 [--stream] [--model auto] [--header 'N: V']

Each of `concurrency` keep-alive connections sends requests back to back until `requests` have been sent in all,
then it stops. Prints one JSON object: latencies (ms), time to first body byte for streams, the gaps between
stream chunks, errors, and requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from urllib.parse import urlsplit

PROMPT = "Write a Python function that adds two numbers."


async def _read_response(reader: asyncio.StreamReader, chunk_times: list[float] | None) -> tuple[int, float]:
    """Read one response; return its status and the time its first body byte arrived."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed")
    status = int(status_line.split()[1])
    length = None
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    first = 0.0
    if chunked:
        while True:
            size = int((await reader.readline()).strip(), 16)
            now = time.perf_counter()
            first = first or now
            if size == 0:
                await reader.readline()
                break
            await reader.readexactly(size + 2)
            if chunk_times is not None:
                chunk_times.append(now)
    else:
        await reader.readexactly(length or 0)
        first = time.perf_counter()
    return status, first


async def _leave_early(
    host: str, port: int, request: bytes, budget: list[int], results: dict[str, list[float]]
) -> None:
    """Ask for a stream, read its head and first chunk, then hang up: a client that walks away mid-stream."""
    while budget[0] > 0:
        budget[0] -= 1
        reader, writer = await asyncio.open_connection(host, port)
        start = time.perf_counter()
        writer.write(request)
        try:
            status = int((await reader.readline()).split()[1])
            await reader.readuntil(b"\r\n\r\n")
            await reader.readline()  # the first chunk's size line: the stream has started
            if status != 200:
                results["errors"].append(status)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
            results["errors"].append(1)
        writer.close()
        results["latency_ms"].append((time.perf_counter() - start) * 1000)


async def _user(
    host: str, port: int, request: bytes, budget: list[int], results: dict[str, list[float]], stream: bool
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while budget[0] > 0:
            budget[0] -= 1
            chunk_times: list[float] | None = [] if stream else None
            start = time.perf_counter()
            writer.write(request)
            try:
                status, first = await _read_response(reader, chunk_times)
            except (ConnectionError, asyncio.IncompleteReadError, ValueError):
                results["errors"].append(1)
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            end = time.perf_counter()
            if status != 200:
                results["errors"].append(status)
            results["latency_ms"].append((end - start) * 1000)
            results["ttfb_ms"].append((first - start) * 1000)
            if chunk_times:
                results["gaps_ms"].extend((b - a) * 1000 for a, b in itertools.pairwise(chunk_times))
    finally:
        writer.close()


async def run(
    url: str,
    concurrency: int,
    requests: int,
    stream: bool,
    model: str,
    body: str | None = None,
    leave_early: bool = False,
    headers: tuple[str, ...] = (),
) -> dict[str, object]:
    parts = urlsplit(url)
    body = body or json.dumps(
        {
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}],
        }
    )
    request = (
        f"POST {parts.path} HTTP/1.1\r\nhost: {parts.hostname}:{parts.port}\r\ncontent-type: application/json\r\n"
        + "".join(f"{header}\r\n" for header in headers)
        + f"content-length: {len(body.encode())}\r\n\r\n{body}"
    ).encode()  # fmt: skip
    results: dict[str, list[float]] = {"latency_ms": [], "ttfb_ms": [], "gaps_ms": [], "errors": []}
    budget = [requests]
    start = time.perf_counter()
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if leave_early:
        await asyncio.gather(*(_leave_early(host, port, request, budget, results) for _ in range(concurrency)))
        return {**results, "elapsed_s": time.perf_counter() - start, "rps": 0.0}
    await asyncio.gather(*(_user(host, port, request, budget, results, stream)
                           for _ in range(concurrency)))  # fmt: skip
    elapsed = time.perf_counter() - start
    return {**results, "elapsed_s": elapsed, "rps": len(results["latency_ms"]) / elapsed}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--model", default="auto")
    parser.add_argument("--body", help="a file whose bytes are sent instead of a chat request")
    parser.add_argument("--leave-early", action="store_true", help="hang up each stream after its first chunk")
    parser.add_argument("--header", action="append", default=[], help="a request header, 'name: value'")
    args = parser.parse_args()
    body = open(args.body, encoding="utf-8").read() if args.body else None
    result = asyncio.run(run(args.url, args.concurrency, args.requests, args.stream or args.leave_early, args.model,
                             body, args.leave_early, tuple(args.header)))  # fmt: skip
    print(json.dumps(result))
