"""The rows of the router benchmark for the other client APIs, set against chat's cache-hit row.

`picked(only, name)` says whether `--only` measures a target; `api_of(name)` is the API a target speaks;
`body_file(api, stream)` its request body for the load generator; `vs_chat(rows)` fills the ratio columns.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._answers import request

CHAT_ROW = "d3router cache hit"  # the chat row the other APIs' rows are set against
API_ROWS = {"responses cache hit": "responses", "messages cache hit": "messages"}
# The same rows with the upstream's `model:` set (issue 26.1): the request's model rewritten to it, the answer's back.
REWRITTEN = "model rewritten, "
REWRITE = ["--upstream-model", "bench"]  # the canned upstream's answers name "bench"
GUARDED = "answer guard, "  # the bench policy with an answer guard (issue 27): every answer judged, a cache hit


def picked(only: list[str], name: str) -> bool:
    """Whether `--only` measures the target `name`: any of its substrings is in the name (no `--only`: all); chat's
    cache-hit row comes with any other API's, which is measured against it, and an API's row with its "model
    rewritten" row, likewise, and chat's with its "answer guard" row."""
    if not only or any(part in name for part in only):
        return True
    if any(part in GUARDED for part in only) and name.removeprefix("stream, ") == "d3router cache hit":
        return True  # the answer guard's rows are measured against the cache hit without one
    if name.endswith(CHAT_ROW) and GUARDED not in name:
        return any(picked(only, name.replace(CHAT_ROW, row)) for row in API_ROWS)
    row = next((row for row in API_ROWS if name.endswith(row)), None)
    return row is not None and REWRITTEN not in name and picked(only, name.replace(row, REWRITTEN + row))


def api_of(name: str) -> str:
    return next((api for row, api in API_ROWS.items() if name.endswith(row)), "chat")


@functools.cache
def body_file(api: str, stream: bool) -> Path | None:
    """A file holding the request body for `api` (None for chat: the load generator's own body)."""
    if api == "chat":
        return None
    path = Path(tempfile.mkdtemp(prefix="d3-bench-body-")) / f"{api}.json"
    path.write_text(request(api, stream), encoding="utf-8")
    return path


def vs_chat(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Fill each other API's row with its requests/s and CPU per request over chat's at the same concurrency (more
    than 1 is faster, resp. costlier); return a summary line per API, plain and streamed."""
    by_name = {(row["target"], row["concurrency"]): row for row in rows}
    found: dict[str, list[tuple[int, float, float, float]]] = {}
    for row in rows:
        chat = by_name.get((row["target"].replace(api_of(row["target"]) + " cache hit", CHAT_ROW), row["concurrency"]))
        if api_of(row["target"]) == "chat" or chat is None:
            continue
        if not chat["rps"] or not chat["p50 ms"]:
            continue  # a quick run too short to measure chat: nothing to compare with
        row["rps vs chat"] = row["rps"] / chat["rps"]
        row["p50 vs chat"] = row["p50 ms"] / chat["p50 ms"]
        if row.get("CPU ms/req") and chat.get("CPU ms/req"):  # a short run may read no CPU time at all
            row["CPU vs chat"] = row["CPU ms/req"] / chat["CPU ms/req"]
        found.setdefault(row["target"], []).append(
            (row["concurrency"], row["rps vs chat"], row["p50 vs chat"], row.get("CPU vs chat", float("nan")))
        )
    return {name: _line(name, ratios) for name, ratios in found.items()}


def vs_plain(rows: list[dict[str, Any]], prefix: str = REWRITTEN, what: str = "not rewritten") -> dict[str, str]:
    """Fill each row named with `prefix` ("model rewritten, ", "answer guard, ") with its requests/s over the same row
    without it, at the same concurrency, in the column "rps vs WHAT"; return a summary line per row (what the
    rewrite, or the guard, costs)."""
    by_name = {(row["target"], row["concurrency"]): row for row in rows}
    column = f"rps vs {what}"
    found: dict[str, list[tuple[int, float, float]]] = {}
    for row in rows:
        plain = by_name.get((row["target"].replace(prefix, ""), row["concurrency"]))
        if prefix not in row["target"] or plain is None or not plain["rps"] or not plain["p50 ms"]:
            continue
        row[column] = row["rps"] / plain["rps"]
        found.setdefault(row["target"], []).append((row["concurrency"], row[column], row["p50 ms"] / plain["p50 ms"]))
    lines = {}
    for name, ratios in found.items():
        levels = "/".join(str(ratio[0]) for ratio in ratios)
        rps = ", ".join(f"{ratio[1]:.2f}" for ratio in ratios)
        p50 = ", ".join(f"{ratio[2]:.2f}" for ratio in ratios)
        lines[name] = f"{name} vs {what} at c={levels}: requests/s x {rps}; p50 x {p50}"
    return lines


def _line(name: str, ratios: list[tuple[int, float, float, float]]) -> str:
    def cells(index: int) -> str:
        return ", ".join(f"{ratio[index]:.2f}" for ratio in ratios)

    levels = "/".join(str(ratio[0]) for ratio in ratios)
    return (f"{name} vs chat at c={levels}: requests/s x {cells(1)}; p50 x {cells(2)}; CPU per request x "
            f"{cells(3)}")  # fmt: skip
