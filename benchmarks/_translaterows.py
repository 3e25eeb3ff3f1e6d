"""The router benchmark's translation rows (issue 30): a route to an upstream of another API (`upstreams.NAME.api`)
against the same client API's native route, plain and streamed, at each concurrency: requests/s and time to the
first body byte. A row family (benchmarks/_families.py):

    python -m benchmarks.router --no-engine --only translated

The Messages client's translated row sends the Messages body to a chat upstream (the canned upstream's
`/chat/completions`); its native row is "messages cache hit" (the canned `/messages`). The chat client's translated
row goes to the canned `/messages` as a Messages upstream; its native row is "d3router cache hit". Likewise the
Responses client to a chat upstream (native: "responses cache hit", the canned `/responses`) and the chat client to
a Responses upstream (router/_translate/responses_chat.py). Every request is a decision cache hit, so that the
difference is the translation.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from typing import Any

from benchmarks._apirows import picked
from benchmarks._families import Run
from benchmarks._harness import interleaved
from benchmarks._targets import proxy

NAME = "translated"

# Row name: (the client's API, the upstream's `api:`, the native row it is set against).
ROWS = {
    "translated, Messages client to a Chat upstream": ("messages", "chat", "messages cache hit"),
    "translated, Chat client to a Messages upstream": ("chat", "messages", "d3router cache hit"),
    "translated, Responses client to a Chat upstream": ("responses", "chat", "responses cache hit"),
    "translated, Chat client to a Responses upstream": ("chat", "responses", "d3router cache hit"),
}
COLUMNS = ["first byte p50 ms", "rps vs native", "first byte vs native"]


def _chosen(only: list[str]) -> list[str]:
    return [name for name in ROWS if picked(only, name)]


def rows(run: Run) -> list[dict[str, Any]]:
    """Each chosen translated row and its native row (one for the translated rows of the same client API), plain
    and streamed, loaded in turns."""
    chosen = _chosen(run.only)
    if not chosen:
        return []
    requests = run.requests // 3 or 10
    base = ["router", "--engine", "cache", "--transport", "aiohttp"]
    out: list[dict[str, Any]] = []
    for stream in (False, True):
        prefix = "stream, " * stream
        with ExitStack() as stack:
            targets, natives = [], set()
            for name in chosen:
                client, api, native = ROWS[name]
                if native not in natives:
                    natives.add(native)
                    targets.append(proxy(stack, f"{prefix}{native} (native, vs translated)", base, run.upstream,
                                         run.extra, stream=stream, api=client))  # fmt: skip
                targets.append(proxy(stack, prefix + name, [*base, "--upstream-api", api], run.upstream, run.extra,
                                     stream=stream, api=client))  # fmt: skip
            out += interleaved(targets, run.levels, requests, run.rounds)
    return out


def summary(found: list[dict[str, Any]]) -> dict[str, str]:
    """Fill each translated row's first byte p50 and its ratios over its native row at the same concurrency; return
    a summary line per translated row."""
    by_name = {(row["target"], row["concurrency"]): row for row in found}
    lines: dict[str, str] = {}
    for row in found:
        data = row.get("_data") or {}
        if data.get("ttfb_ms"):
            row["first byte p50 ms"] = statistics.median(data["ttfb_ms"])
    for row in found:
        name = row["target"].removeprefix("stream, ")
        if name not in ROWS:
            continue
        prefix = "stream, " * row["target"].startswith("stream, ")
        native = by_name.get((f"{prefix}{ROWS[name][2]} (native, vs translated)", row["concurrency"]))
        if native is None or not native["rps"] or not native.get("first byte p50 ms"):
            continue
        row["rps vs native"] = row["rps"] / native["rps"]
        row["first byte vs native"] = row.get("first byte p50 ms", float("nan")) / native["first byte p50 ms"]
        key = row["target"]
        first = row.get("first byte p50 ms", float("nan"))
        part = (f"c={row['concurrency']}: {row['rps']:.0f} rps ({row['rps vs native']:.2f}x native), first byte "
                f"{first:.2f} ms ({row['first byte vs native']:.2f}x)")  # fmt: skip
        lines[key] = f"{lines[key]}; {part}" if key in lines else f"{key}: {part}"
    return lines


vs_native = summary  # its name before the row families (benchmarks/_families.py)
