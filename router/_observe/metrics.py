"""Prometheus metrics on prometheus_client, right with one process or several (`d3router serve --workers N`).

Names, label names, help texts and buckets are the ones the router has always shown (tests/router/
test_metrics_names.py pins them). With several workers the library's multi-process mode is on: `serve_workers`
sets `PROMETHEUS_MULTIPROC_DIR` to a directory of its own before the workers start (they import prometheus_client
after it), each worker writes its values there, and whichever worker answers `/metrics` reads them all, so every
scrape shows the totals of every worker, dead ones included (a counter never goes back).

Process metrics (CPU seconds, resident and virtual memory, open and max fds, start time): with one process, the
library's own `process_*` series. With several, a collector in one process only sees itself, so the worker that
answers reads `/proc` for every process of the router, the supervisor and the processes it started, and labels
each series with its `pid` (`sum(rate(process_cpu_seconds_total[1m]))` is the router's CPU either way; a
restarted worker is a new series, not a counter that goes back).

Engine URLs (a remote engine's pool, `RemoteEngine.pool_stats()`): read at each scrape and shown as
`d3router_engine_url_in_flight{url}` and `d3router_engine_url_healthy{url}` (gauges), and
`d3router_engine_url_requests_total{url,result}` (`ok`: answered, refusals included; `error`: connection, timeout, 5xx
or 429), `d3router_engine_url_ejections_total{url}` and `d3router_engine_url_probes_total{url,result}`. The URLs
carry no credentials. Each process has its own pool: with several workers, in-flight calls are summed over the live
workers (`livesum`), health is each worker's own view (`liveall`, one series per `pid`), counters are totals; each
worker writes its share every second (`follow_engine_pool`), whichever worker answers the scrape. An engine pool
(`engine.pool`) shows the URLs of its remote engines so, and its engines' own state (router/_observe/pools.py).

The call sites keep the plain shape they had: `metrics.engine_errors[kind] += 1`,
`metrics.decision_seconds[policy].observe(s)`, `metrics.cache_entries = n`; `metrics.counter(...)` makes a new
counter family of the same shape, `metrics.gauge(...)` a gauge.
"""

from __future__ import annotations

import asyncio
import glob
import os
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess, values
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from d3backend import CachedEngine, Decided, DecisionEngine, FailoverEngine, RemoteEngine
from router._observe.pools import PoolFamilies

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")


def multiprocess_dir() -> str | None:
    """The directory of multi-process mode, when prometheus_client was imported with it set (values are then kept
    in files there, whatever the environment says later)."""
    if values.ValueClass is values.MutexValue:
        return None
    return os.environ.get(MULTIPROC_ENV)


class Count:
    """One counter series; `+=` adds to it (the value handed back to the mapping is this same object)."""

    __slots__ = ("_child",)

    def __init__(self, child: Counter) -> None:
        self._child = child

    def __iadd__(self, amount: float) -> Count:
        self._child.inc(amount)
        return self


class _Series(Generic[K, C]):
    """Series of one family by label values, made on first use and kept (the label values come from the
    configuration and from closed sets, so they stay few)."""

    def __init__(self, make: Callable[[K], C]) -> None:
        self._make = make
        self._series: dict[K, C] = {}

    def __getitem__(self, key: K) -> C:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._make(key)
        return series

    def __setitem__(self, key: K, value: C) -> None:
        """The end of `family[key] += n`: the series already counted it."""

    def __contains__(self, key: object) -> bool:
        return key in self._series


class Counts(_Series[K, Count]):
    """A counter family: `family[label_value] += 1`, or `family[(value, value)] += 1` with several labels."""

    def __init__(self, counter: Counter) -> None:
        super().__init__(lambda key: Count(counter.labels(*(key if isinstance(key, tuple) else (key,)))))


class Metrics:
    """What `/metrics` shows. Label values come from the configuration (policy, rule, upstream names) and from
    a closed set of actions, statuses and error kinds, so the series stay few."""

    def __init__(self) -> None:
        self._own = CollectorRegistry(auto_describe=True)
        self._dir = multiprocess_dir()
        self._cache_entries: int | None = None
        self._cache_gauge: Gauge | None = None
        self._requests = Counter("d3router_requests", "Chat requests by policy, rule, action and status.",
                                 ("policy", "rule", "action", "status"), registry=self._own)  # fmt: skip
        self.engine_errors: Counts[str] = self.counter(
            "d3router_engine_errors", "Decision engine failures by kind.", ("kind",)
        )
        self.cache: Counts[str] = self.counter(
            "d3router_decision_cache", "Decisions answered from the cache (hit) or not (miss).", ("result",)
        )
        self._cache_entries_at = len(list(self._own.collect()))  # the gauge is made when first set, shown here
        self.upstream_errors: Counts[tuple[str, str]] = self.counter(
            "d3router_upstream_errors", "Upstream attempts that failed, by upstream and kind.", ("upstream", "kind")
        )
        decision = Histogram("d3router_decision_seconds", "Time to decide (engine call or cache), by policy.",
                             ("policy",), buckets=LATENCY_BUCKETS_S, registry=self._own)  # fmt: skip
        upstream = Histogram("d3router_upstream_seconds", "Time to the upstream's response headers, by upstream.",
                             ("upstream",), buckets=LATENCY_BUCKETS_S, registry=self._own)  # fmt: skip
        self.decision_seconds: _Series[str, Histogram] = _Series(decision.labels)
        self.upstream_seconds: _Series[str, Histogram] = _Series(upstream.labels)
        self.engine_tokens: Counts[str] = self.counter(
            "d3router_engine_tokens",
            "Tokens of engine calls (cache hits not counted): input, of which cached (a hosted model's prompt cache), "
            "and output.",
            ("kind",),
        )
        self._request_series: _Series[tuple[str, str, str, str], Counter] = _Series(
            lambda key: self._requests.labels(*key)
        )
        self._pool: PoolFamilies | None = None  # made when a remote engine or a pool is first shown
        self._log_dropped: Counts[str] | None = None  # made with the first decision log
        self._answer_verdicts: Counts[tuple[str, str, str]] | None = None  # made with the first answer judged
        self._answer_judgements: Counts[str] | None = None
        self._engine_answers: Counts[str] | None = None
        self._translation_losses: Counts[tuple[str, str, str]] | None = None  # made with the first loss
        self.translation_loss_names: set[str] = set()  # its loss label values so far (router/_faces/translated.py)
        self.multiprocess = self._dir is not None
        self.process = ProcessCollector(registry=None)
        self.before_render: list[Callable[[], None]] = []  # what moves values kept aside into the families
        self._shown = CollectorRegistry(auto_describe=False)
        self._shown.register(_Exposed(self))

    @property
    def decision_log_dropped(self) -> Counts[str]:
        """Decision log lines dropped, by reason (full, error); shown once a decision log was opened."""
        if self._log_dropped is None:
            self._log_dropped = self.counter(
                "d3router_decision_log_dropped",
                "Decision log lines dropped: the writer's queue was full, or the file could not be written.",
                ("reason",),
            )
        return self._log_dropped

    @property
    def answer_verdicts(self) -> Counts[tuple[str, str, str]]:
        """Answers judged by answer guards (issue 27), by policy, rule and outcome; shown once one was judged."""
        if self._answer_verdicts is None:
            self._answer_verdicts = self.counter(
                "d3router_answer_verdicts",
                "Answers judged by a policy's answer guard, by policy, the rule that stopped it (- for none) and "
                "outcome (pass, block, replace, broken).",
                ("policy", "rule", "outcome"),
            )
        return self._answer_verdicts

    @property
    def translation_losses(self) -> Counts[tuple[str, str, str]]:
        """What translated requests and answers could not carry (issue 30), by client API, upstream API and loss;
        shown once something was lost."""
        if self._translation_losses is None:
            self._translation_losses = self.counter(
                "d3router_translation_losses",
                "What a translated request or answer could not carry (docs/translation.md), by client API, upstream "
                "API and loss.",
                ("client", "upstream", "loss"),
            )
        return self._translation_losses

    @property
    def answer_judgements(self) -> Counts[str]:
        """Engine calls of answer guards, by policy; shown once one was made."""
        if self._answer_judgements is None:
            self._answer_judgements = self.counter(
                "d3router_answer_judgements",
                "Engine calls of answer guards (a whole answer, a slice of a long one, a window of a stream), by "
                "policy.",
                ("policy",),
            )
        return self._answer_judgements

    @property
    def engine_answers(self) -> Counts[str]:
        """Engine answers by the pool's engine that gave them (issue 28.2); shown once a pool answered."""
        if self._engine_answers is None:
            self._engine_answers = self.counter(
                "d3router_engine_answers",
                "Answers of an engine pool (engine.pool), by the engine that gave them (cache hits not counted).",
                ("engine",),
            )
        return self._engine_answers

    def usage(self, decided: Decided) -> None:
        """Count an engine call's answer: a cache hit or miss, and, for a miss, its tokens (and its pool's engine)."""
        self.cache["hit" if decided.cached else "miss"] += 1
        if not decided.cached:
            if decided.engine:
                self.engine_answers[decided.engine] += 1
            usage = decided.usage
            self.engine_tokens["input"] += usage.input_tokens
            self.engine_tokens["cached"] += usage.cached_tokens
            self.engine_tokens["output"] += usage.output_tokens

    def request(self, policy: str, rule: str, action: str, status: int) -> None:
        self._request_series[(policy, rule, action, str(status))].inc()

    def counter(self, name: str, help_text: str, labels: Iterable[str]) -> Counts[Any]:
        """A new counter family, shown as `<name>_total` (`name` without the suffix)."""
        return Counts(Counter(name, help_text, tuple(labels), registry=self._own))

    def histogram(self, name: str, help_text: str, labels: Iterable[str], buckets: Iterable[float]) -> Histogram:
        """A new histogram family (`family.labels(value).observe(x)`)."""
        return Histogram(name, help_text, tuple(labels), buckets=tuple(buckets), registry=self._own)

    def gauge(self, name: str, help_text: str) -> Gauge:
        """A new gauge without labels; with several workers, the largest value of the live ones (a state any worker
        is in, such as `d3router_redis_down`)."""
        return Gauge(name, help_text, registry=self._own, multiprocess_mode="livemax")

    @property
    def cache_entries(self) -> int | None:
        """A gauge, set when the engine has a cache (with several workers: the sum over the live workers of what
        each held when it last set it)."""
        return self._cache_entries

    @cache_entries.setter
    def cache_entries(self, entries: int | None) -> None:
        if entries is None:
            return
        if self._cache_gauge is None:
            self._cache_gauge = Gauge("d3router_decision_cache_entries", "Decisions held in the cache.",
                                      registry=None, multiprocess_mode="livesum")  # fmt: skip
        self._cache_entries = entries
        self._cache_gauge.set(entries)

    def engine_pool(self, engine: DecisionEngine | None) -> None:
        """Take the per-URL state of a remote engine, and of each engine of a pool (its members' failures, whether
        each is set aside, the URLs of its remote ones), behind the cache or not, for the next render (no-op for
        other engines)."""
        inner = engine.engine if isinstance(engine, CachedEngine) else engine
        if isinstance(inner, RemoteEngine | FailoverEngine):
            if self._pool is None:
                self._pool = PoolFamilies(self._own)
            self._pool.update(inner)

    def follow_engine_pool(self, engine: DecisionEngine | None, every_s: float = 1.0) -> asyncio.Task[None] | None:
        """With several workers, a task on the running loop that takes the engine's per-URL state every `every_s`
        (the caller cancels it), so that each worker's share is fresh whichever worker answers a scrape; None with
        one process (the scrape takes it) or without a remote engine or a pool."""
        inner = engine.engine if isinstance(engine, CachedEngine) else engine
        if self._dir is None or not isinstance(inner, RemoteEngine | FailoverEngine):
            return None

        async def follow(followed: RemoteEngine | FailoverEngine) -> None:
            while True:
                self.engine_pool(followed)
                await asyncio.sleep(every_s)

        return asyncio.get_running_loop().create_task(follow(inner))

    def render(self) -> str:
        for flush in self.before_render:
            flush()
        return generate_latest(self._shown).decode()

    def families(self) -> list[Metric]:
        """The router's own families in their usual order, from this process or, with several workers, from all
        of them."""
        families = list(self._own.collect())
        if self._dir is None:
            if self._cache_gauge is not None:
                families[self._cache_entries_at : self._cache_entries_at] = self._cache_gauge.collect()
            return families
        _forget_dead_workers(self._dir)
        merged = {family.name: family for family in multiprocess.MultiProcessCollector(None, self._dir).collect()}  # type: ignore[no-untyped-call]
        names = [family.name for family in families]
        names.insert(self._cache_entries_at, "d3router_decision_cache_entries")
        return [merged[name] for name in names if name in merged]


class _Exposed(Collector):
    """The router's families in their usual order and form (no `_created` series, `le="1"` not `"1.0"`), then
    the process metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        for family in self._metrics.families():
            family.samples = [
                sample._replace(labels={**sample.labels, "le": _bound(sample.labels["le"])})
                if "le" in sample.labels
                else sample
                for sample in family.samples
                if not sample.name.endswith("_created")
            ]
            yield family
        if self._metrics.multiprocess:
            yield from _router_processes()
        else:
            yield from self._metrics.process.collect()


def _bound(le: str) -> str:
    return le if le == "+Inf" else f"{float(le):g}"


def _router_processes() -> Iterable[Metric]:
    """The process metrics of every process of the router, each series labelled with its pid."""
    merged: dict[str, Metric] = {}
    for pid in _router_pids():
        for family in _process(pid).collect():
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                into.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
    return merged.values()


def _process(pid: int) -> ProcessCollector:
    return ProcessCollector(pid=lambda: pid, registry=None)


def _router_pids() -> list[int]:
    """The supervisor (this worker's parent) and every process it started."""
    supervisor = os.getppid()
    pids = [supervisor]
    for children in glob.glob(f"/proc/{supervisor}/task/*/children"):
        try:
            with open(children, encoding="ascii") as file:
                pids += [int(pid) for pid in file.read().split()]
        except OSError:
            continue
    return pids


def _forget_dead_workers(path: str) -> None:
    """Mark the workers that are gone as dead, at each scrape: their live gauges leave the sums (their counters
    stay in the totals). Done here, not on a worker's exit: uvicorn's supervisor has no hook for it, a worker
    process ends without running `atexit`, and a killed one runs nothing."""
    for file in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        pid = int(file.rsplit("_", 1)[1].removesuffix(".db"))
        if not os.path.exists(f"/proc/{pid}"):
            multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
