"""The answer guard on a long stream (issue 27): a 2,000-token chat answer through d3router with a windowed answer
guard and an engine taking 20 ms a call, against the same route without the guard, in turns.

    python -m benchmarks._answerrows [--tokens 2000] [--engine-ms 20] [--gap-ms 1] [--requests 8] [--quick]
    python -m benchmarks.router --no-engine --only "2,000-token"          # the same rows from the router benchmark

Two upstream paces: `burst` (every token at once, the upstream faster than any model) and `paced` (token i at
i x `--gap-ms` from the stream's start, a fast model; held to the clock, so a late wake-up does not stretch it).
Each token is one SSE event of 4 characters, so 2,000 tokens are 8,000 characters: about eight windows of the
default `window_chars: 1024` (each judged with the 256 before it), each an engine call of `--engine-ms`. Both
proxies decide the request itself with the same engine (one call of `--engine-ms` each: it cancels out); the
guarded one also judges every window. Rows: time to first byte and to the stream's end (p50), and what the guard
added to each. What pipelining promises: a paced stream whose windows fill slower than the
engine judges them ends about one decision (`--engine-ms`) after the unguarded one; its first byte waits for the
first window to fill and be judged. The proxies have core 1, the upstream and the load generator core 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from contextlib import ExitStack
from typing import Any

from benchmarks._harness import PY, Target, _pin, interleaved, load, process
from benchmarks._report import add_arguments, write
from d3backend import free_port

ROW = "answer guard, 2,000-token stream"  # the router benchmark's --only picks these rows by this name
TOKEN = "tok "
COLUMNS = ["pace", "target", "requests", "errors", "ttfb p50 ms", "total p50 ms", "ttfb added ms", "total added ms",
           "windows", "CPU ms/req"]  # fmt: skip


# --- the upstream: one long chat stream, a token an event ------------------------------------------------------
def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    data = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tokens: int, gap_s: float) -> None:
    token = _event({"content": TOKEN})
    loop = asyncio.get_running_loop()
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(_event({"role": "assistant", "content": ""}))
            start = loop.time()
            for index in range(tokens):
                writer.write(token)
                if gap_s:  # token i goes at start + i * gap: the pace holds whatever a sleep overshoots
                    await writer.drain()
                    await asyncio.sleep(max(0.0, start + (index + 1) * gap_s - loop.time()))
            writer.write(_event({}, "stop"))
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _upstream(port: int, tokens: int, gap_s: float) -> None:
    server = await asyncio.start_server(lambda r, w: _serve(r, w, tokens, gap_s), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# --- the rows ------------------------------------------------------------------------------------------------
def rows(tokens: int = 2000, engine_ms: float = 20.0, gap_ms: float = 1.0, requests: int = 8, rounds: int = 2
         ) -> list[dict[str, Any]]:  # fmt: skip
    """Per pace (burst, paced): the unguarded and the guarded stream's first byte and end, and what the guard
    added (p50), at concurrency 1."""
    out: list[dict[str, Any]] = []
    for pace, gap in (("burst", 0.0), (f"paced, {gap_ms:g} ms/token", gap_ms)):
        with ExitStack() as stack:
            port = free_port()
            upstream = f"http://127.0.0.1:{port}/v1"
            argv = [*_pin(0), PY, "-m", "benchmarks._answerrows", "upstream", str(port), "--tokens", str(tokens),
                    "--gap-ms", str(gap)]  # fmt: skip
            stack.enter_context(process(argv, f"{upstream}/chat/completions"))
            targets = []
            for name, policy in (("unguarded", "questions"), ("answer guard", "answer")):
                router_port = free_port()
                url = f"http://127.0.0.1:{router_port}/v1/chat/completions"
                argv = [*_pin(1), PY, "-m", "benchmarks._proxy", "router", str(router_port), upstream, "--engine",
                        f"fake{engine_ms:g}ms", "--policy", policy, "--sessions", "off"]  # fmt: skip
                proc = stack.enter_context(process(argv, url))
                load(url, 1, 2, stream=True)  # warm up
                targets.append(Target(f"{ROW}, {name}", url, (lambda pid: lambda: [pid])(proc.pid), stream=True))
            measured = interleaved(targets, (1,), requests, rounds)
        plain = measured[0]["_data"]
        for row in measured:
            data = row["_data"]
            ttfb, total = statistics.median(data["ttfb_ms"]), statistics.median(data["latency_ms"])
            out.append({
                "pace": pace, "target": row["target"], "requests": row["requests"], "errors": row["errors"],
                "ttfb p50 ms": ttfb, "total p50 ms": total,
                "ttfb added ms": ttfb - statistics.median(plain["ttfb_ms"]),
                "total added ms": total - statistics.median(plain["latency_ms"]),
                "windows": -(-tokens * len(TOKEN) // 1024) if row["target"].endswith("answer guard") else 0,
                "CPU ms/req": row.get("CPU ms/req"),
            })  # fmt: skip
    return out


def main() -> None:
    if sys.argv[1:2] == ["upstream"]:
        parser = argparse.ArgumentParser()
        parser.add_argument("mode")
        parser.add_argument("port", type=int)
        parser.add_argument("--tokens", type=int, default=2000)
        parser.add_argument("--gap-ms", type=float, default=1.0)
        args = parser.parse_args()
        asyncio.run(_upstream(args.port, args.tokens, args.gap_ms / 1000))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--engine-ms", type=float, default=20.0)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=8, help="per target and pace, over all rounds")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    requests, rounds = (2, 1) if args.quick else (args.requests, args.rounds)
    measured = rows(args.tokens, args.engine_ms, args.gap_ms, requests, rounds)
    command = "python -m benchmarks._answerrows " + " ".join(sys.argv[1:])
    print(write("answer-stream", measured, COLUMNS, command.strip(), args.results))


if __name__ == "__main__":
    main()
