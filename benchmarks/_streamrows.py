"""The router benchmark's streamed rows: `streams()`, the cache hit streamed (6 chunks sent at once) on two
transports and the other client APIs (and through the peers, with `--peers`); `streaming()`, the first byte and the
gaps between chunks of a slow upstream (a chunk every 20 ms) at c=1, directly, through d3router and through the bare
pass-through (router-extra.json's `streaming`; with `--only`, measured when `--only streaming` is among them).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from benchmarks import _peers
from benchmarks._apirows import GUARDED, REWRITE, REWRITTEN, api_of, picked
from benchmarks._harness import PY, Target, _pin, interleaved, process
from benchmarks._targets import peer_targets, proxy
from d3backend import free_port

STREAMING = "streaming: first byte and chunk gaps at c=1"  # the name `--only` picks it by


def streams(
    upstream: str,
    levels: tuple[int, ...],
    requests: int,
    rounds: int,
    extra: dict[str, Any],
    only: list[str],
    peers: list[Target] | None = None,
) -> list[dict[str, Any]]:
    """Streamed answers (6 chunks, sent at once) through d3router on our transport and on httpx-aiohttp's, and on
    the Responses and Messages APIs (on our transport); and through the peers, if given."""
    chosen = [(name, transport) for name, transport in (
        ("stream, d3router cache hit", "aiohttp"), ("stream, responses cache hit", "aiohttp"),
        ("stream, messages cache hit", "aiohttp"), ("stream, d3router cache hit, httpx-aiohttp pool", "httpx-aiohttp"),
        (f"stream, {REWRITTEN}responses cache hit", "aiohttp"), (f"stream, {REWRITTEN}messages cache hit", "aiohttp"),
        (f"stream, {GUARDED}d3router cache hit", "aiohttp"),
    ) if picked(only, name)]  # fmt: skip
    if not chosen:
        return []
    with ExitStack() as stack:
        targets = [Target("stream, direct", f"{upstream}/chat/completions", stream=True)]
        for name, transport in chosen:
            spec = ["router", "--engine", "cache", "--transport", transport, *(REWRITE * (REWRITTEN in name)),
                    *(["--policy", "answer"] * (GUARDED in name))]  # fmt: skip
            targets.append(proxy(stack, name, spec, upstream, extra, stream=True, api=api_of(name)))
        return interleaved(targets + (peers or []), levels, requests, rounds)


def streaming(requests: int, rounds: int, peers: _peers.Peers | None = None) -> dict[str, Any]:
    """TTFB and inter-chunk gaps at concurrency 1, in turns, from an upstream of its own sending a chunk every 20 ms:
    directly, through d3router (cache hit), through the bare Starlette pass-through on the same transport and, with
    `peers`, through nginx and LiteLLM proxy; each one's first byte also as added over the direct one's."""
    calls: dict[str, Any] = {"engine_calls": {}}  # what the proxies print as they stop: not reported here
    port = free_port()
    upstream = f"http://127.0.0.1:{port}/v1"
    with ExitStack() as stack:
        stack.enter_context(process([*_pin(0), PY, "-m", "benchmarks._upstream", str(port), "--gap-ms", "20"],
                                    f"{upstream}/chat/completions"))  # fmt: skip
        targets = [Target("direct", f"{upstream}/chat/completions", stream=True)]
        for name, spec in (("d3router", ["router"]), ("pass-through", ["passthrough", "--transport", "aiohttp"])):
            targets.append(proxy(stack, name, spec, upstream, calls, stream=True))
        if peers is not None:
            targets += [replace(target, name=target.name.removeprefix("stream, "))
                        for target in peer_targets(stack, peers, upstream, stream=True)]  # fmt: skip
        rows = interleaved(targets, (1,), requests, rounds)
    result: dict[str, Any] = {row["target"]: timing(row["_data"]) for row in rows}
    direct = result["direct"]["ttfb p50 ms"]
    for name in [name for name in result if name != "direct"]:
        result[name]["ttfb added p50 ms"] = result[name]["ttfb p50 ms"] - direct
    result["ttfb added p50 ms"] = result["d3router"]["ttfb added p50 ms"]
    return result


def timing(data: dict[str, Any]) -> dict[str, Any]:
    """One target's first byte and chunk gaps (NaN when none came: every request failed, or none streamed), its
    errors and what they were, as the load generator saw them: an HTTP status, or 1 for a connection that closed."""
    return {
        "ttfb p50 ms": statistics.median(data["ttfb_ms"]) if data["ttfb_ms"] else math.nan,
        "chunk gap p50 ms": statistics.median(data["gaps_ms"]) if data["gaps_ms"] else math.nan,
        "chunk gap min ms": min(data["gaps_ms"], default=math.nan),
        "errors": len(data["errors"]),
        "error statuses": dict(Counter(str(status) for status in data["errors"])),
    }
