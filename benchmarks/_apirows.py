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


def picked(only: list[str], name: str) -> bool:
    """Whether `--only` measures the target `name`: any of its substrings is in the name (no `--only`: all); chat's
    cache-hit row comes with any other API's, which is measured against it."""
    if not only or any(part in name for part in only):
        return True
    return name.endswith(CHAT_ROW) and any(picked(only, name.replace(CHAT_ROW, row)) for row in API_ROWS)


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


def _line(name: str, ratios: list[tuple[int, float, float, float]]) -> str:
    def cells(index: int) -> str:
        return ", ".join(f"{ratio[index]:.2f}" for ratio in ratios)

    levels = "/".join(str(ratio[0]) for ratio in ratios)
    return (f"{name} vs chat at c={levels}: requests/s x {cells(1)}; p50 x {cells(2)}; CPU per request x "
            f"{cells(3)}")  # fmt: skip
