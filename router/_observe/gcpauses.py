"""The garbage collector kept out of the tail (issue 31.5): `settle()` once after start-up, `Pauses` to see it.

Without this, a cache-hit request at c=8 had its slowest request at 42-57 ms against a 1-3 ms p50: full (generation
2) collections of 33-52 ms, about one per 2,000 requests. What they find is not the hot path's: with
`gc.DEBUG_SAVEALL` over 1,000 cache-hit requests the collector freed 95 objects, all of them start-up's (argparse's
and logging.config's). What makes them long is what they walk: every tracked object, 81,634 after start-up (the
imported modules, pydantic's schemas, Starlette's and uvicorn's objects, the parsed configuration), which live as
long as the process. What starts them is the churn of the requests in flight: a young collection runs whenever
allocations outnumber frees by 700, which 8 requests in flight (a few hundred tracked objects each: dicts, lists,
coroutines, futures) reach every request or two; it moves what is alive at that moment (the requests in flight) to
the older generations, which fill, and every so often one full collection walks the whole heap.

`settle()` collects once, then `gc.freeze()` moves everything alive into the permanent generation, which the
collector never walks: a full collection walks what requests leave behind (0.002 ms just after settling, against
99 ms before, on this machine under load). A raised generation-0 threshold (`GEN0_THRESHOLD` instead of 700) is
above what the requests in flight hold even at c=64, so the churn of requests does not start collections at all;
the cost is at most that many cyclic objects waiting to be freed (a few megabytes).

Measured with `python -m benchmarks.router --no-engine --only "gc unsettled"` (the "gc" columns: collections per
generation, full ones per 10,000 requests, the longest pause; the "d3router cache hit, gc unsettled" row is the same
router without `settle()`, beside "d3router cache hit" in the same turns; `benchmarks._proxy --gen0 N` tries
other thresholds): see benchmarks/README.md "The tail" for the figures.

`d3router serve` calls `settle()` once its app has started (router/_faces/serve.py), `resettle()` after each
configuration reload once the replaced configuration has served its last request, and records the pauses in its
metrics (`watch`): `d3router_gc_pause_seconds` (a histogram, by generation) and `d3router_gc_collections_total`
(by generation). The recorder's callback only appends to a list (it may run inside any allocation, even with one of
prometheus_client's locks held), and the list is moved into the metrics at each scrape and every second.

    from router._observe import gcpauses
    gcpauses.settle()
    pauses = gcpauses.Pauses(metrics).install()   # ... pauses.flush() before a scrape; pauses.uninstall()
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, Self

from router._observe.metrics import Metrics

# Allocations (net of frees) of tracked objects between young collections; CPython's default is 700. 20,000: no
# collection in 3,000 cache-hit requests at c=8 or c=64 (700, frozen: 185 and 380 young ones, 13 ms the longest).
GEN0_THRESHOLD = 20_000
PAUSE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
MAX_PENDING = 100_000  # pauses kept between two flushes (about a second's): past it they are counted, not timed
GENERATIONS = ("0", "1", "2")


def settle(gen0: int = GEN0_THRESHOLD) -> None:
    """Collect what start-up left, move every object alive now out of the collector's way (`gc.freeze()`), and
    raise the generation-0 threshold to `gen0` (the older ones keep theirs). Call once, after start-up; calling it
    again freezes what has been allocated since (a configuration reload's objects, say)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)


def resettle() -> None:
    """`settle()` again after a configuration reload, once the replaced configuration served its last request:
    everything frozen goes back to the collector, which frees what only the old configuration held (cycles among
    frozen objects would otherwise stay for the process's life), and what is alive now (the new configuration)
    is frozen. One full collection, a pause like start-up's (tens of milliseconds), once per reload."""
    gc.unfreeze()
    settle(gc.get_threshold()[0])


class Pauses:
    """How long each garbage collection of this process stops it, through `gc.callbacks`, into `metrics`."""

    def __init__(self, metrics: Metrics) -> None:
        self.histogram = metrics.histogram(
            "d3router_gc_pause_seconds", "Garbage collection pauses of the process, by generation.",
            ("generation",), PAUSE_BUCKETS_S,
        )  # fmt: skip
        self.collections = metrics.counter(
            "d3router_gc_collections", "Garbage collections of the process, by generation.", ("generation",)
        )
        for generation in GENERATIONS:  # every series shown from the start, at 0
            self.histogram.labels(generation)
            self.collections[generation] += 0
        self._started = 0.0
        self._pending: list[tuple[int, float]] = []
        self._total = [0, 0, 0]  # collections per generation, every one (timed or not)
        self._flushed = [0, 0, 0]
        self.longest_s = 0.0  # since the last `window()`
        self.counts = [0, 0, 0]  # since the last `window()`
        self._task: asyncio.Task[None] | None = None
        metrics.before_render.append(self.flush)

    def install(self) -> Self:
        """Start recording (once: a second call does nothing)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        """Stop recording, and move what was recorded into the metrics."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.flush()

    def cancel(self) -> None:
        """`uninstall`, under the name the app's close calls on what its startup hooks returned."""
        self.uninstall()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside whatever allocation triggered the collection: no locks, no logging, nothing but plain values.
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self._total[generation] += 1
        self.counts[generation] += 1
        self.longest_s = max(self.longest_s, pause)
        if len(self._pending) < MAX_PENDING:
            self._pending.append((generation, pause))

    def flush(self) -> None:
        """Move the pauses recorded since the last flush into the metrics."""
        pending, self._pending = self._pending, []
        for generation, pause in pending:
            self.histogram.labels(GENERATIONS[generation]).observe(pause)
        total = list(self._total)
        for generation, label in enumerate(GENERATIONS):
            grown = total[generation] - self._flushed[generation]
            if grown:
                self.collections[label] += grown
        self._flushed = total

    def window(self) -> dict[str, Any]:
        """Collections per generation and the longest pause (ms) since the last call (the benchmark reads it)."""
        counts, longest = self.counts, self.longest_s
        self.counts, self.longest_s = [0, 0, 0], 0.0
        return {"collections": counts, "longest pause ms": longest * 1000}

    def follow(self, every_s: float = 1.0) -> asyncio.Task[None]:
        """A task on the running loop that flushes every `every_s` (with several workers, each worker's share
        reaches the shared files whichever worker answers a scrape); `uninstall` cancels it."""

        async def follow() -> None:
            while True:
                await asyncio.sleep(every_s)
                self.flush()

        self._task = asyncio.get_running_loop().create_task(follow())
        return self._task
