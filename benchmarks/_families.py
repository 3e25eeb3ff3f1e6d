"""The router benchmark's row families: groups of rows measured in turns of their own, each a module registered by
one line in `FAMILIES`.

A family module has:

    NAME: str                                   # its key in router-extra.json
    COLUMNS: list[str]                          # the columns it fills (shown when some row has them)
    def rows(run: Run) -> list[dict[str, Any]]  # its rows, measured; [] unless `--only` picks one of them
    def summary(rows: list[dict[str, Any]]) -> dict[str, str]

`rows(run)` starts what it needs (benchmarks/_targets.py `proxy()`, benchmarks/_harness.py `process()`) in an
ExitStack of its own and loads its targets with `interleaved()`: the rows it is set against go in the same turns.
Which of its rows `run.only` picks it says itself (benchmarks/_apirows.py `picked()`: any `--only` substring in the
name; no `--only`, all). `summary(rows)` gets every row of the run, `_data` (the merged load results: `ttfb_ms`,
`latency_ms`, ...) still in them, before "added p50 ms" is filled; it fills its columns on its own rows and returns a
summary line per row or comparison, printed under the table after the other summaries, in the order of
`FAMILIES`. Rows come in that order too, after the streamed cache-hit rows.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

# One line a family, in the order their rows and summaries are reported.
FAMILIES = (
    "benchmarks._translaterows",  # issue 30: translated routes vs native, plain and streamed
    "benchmarks._usagerows",  # issue 29: usage counted, budgets in process and in Redis, vs usage off
    "benchmarks._overlaprouterrows",  # issue 31: time to first byte added, with and without overlap, four APIs
)


@dataclass
class Run:
    """What a family's `rows()` is given: the run's canned upstream and its settings."""

    upstream: str  # the fast canned upstream (benchmarks/_upstream.py), ".../v1"
    levels: tuple[int, ...]  # the concurrencies: (1, 8, 64), or (1, 8) with --quick
    requests: int  # --requests (60 with --quick): per target and concurrency, over all rounds
    rounds: int
    only: list[str]  # --only (empty: every row)
    extra: dict[str, Any]  # router-extra.json; `proxy()` fills its "engine_calls"
    work: Path  # a scratch directory of the run's own
    quick: bool
    engine: bool  # False with --no-engine (no real engine rows)


class Family(Protocol):
    NAME: str
    COLUMNS: list[str]

    def rows(self, run: Run) -> list[dict[str, Any]]: ...

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, str]: ...


def families() -> list[Family]:
    """The registered families' modules, imported."""
    return [cast(Family, importlib.import_module(name)) for name in FAMILIES]
