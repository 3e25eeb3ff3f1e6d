"""The engine families of /metrics that follow an engine's own counters: a remote engine's URLs, and an engine
pool's engines (issue 28), read at each scrape (router/_observe/metrics.py `Metrics.engine_pool`).

- Per URL, for a remote engine and for every remote engine of a pool: `d3router_engine_url_in_flight{url}`,
  `d3router_engine_url_healthy{url}` (gauges), `d3router_engine_url_requests_total{url,result}`,
  `d3router_engine_url_ejections_total{url}`, `d3router_engine_url_probes_total{url,result}`.
- Per engine of a pool (`engine.pool`, by its label): `d3router_engine_pool_failures_total{engine}` (calls it could
  not answer: unreachable, a 5xx, a 429, a refusal, a bad answer, its own deadline) and
  `d3router_engine_pool_set_aside{engine}` (1 while calls skip it after a failure of its own). Its answers are
  `d3router_engine_answers_total{engine}`, counted as they come.

Counters follow the engine's totals: each scrape adds what grew since the last.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from d3backend import FailoverEngine, PoolStats, RemoteEngine, UrlStats


class PoolFamilies:
    """The families of `engine_pool`, made on the registry of the first engine shown."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.in_flight = Gauge("d3router_engine_url_in_flight", "Decision engine calls in flight, by engine URL.",
                               ("url",), registry=registry, multiprocess_mode="livesum")  # fmt: skip
        self.healthy = Gauge("d3router_engine_url_healthy",
                             "1 while the engine URL is in rotation, 0 while it is ejected (awaiting a probe).",
                             ("url",), registry=registry, multiprocess_mode="liveall")  # fmt: skip
        self.requests = Counter("d3router_engine_url_requests", "Decision engine calls by engine URL and result.",
                                ("url", "result"), registry=registry)  # fmt: skip
        self.ejections = Counter("d3router_engine_url_ejections", "Times an engine URL was taken out of rotation.",
                                 ("url",), registry=registry)  # fmt: skip
        self.probes = Counter("d3router_engine_url_probes", "Probes of ejected engine URLs, by engine URL and result.",
                              ("url", "result"), registry=registry)  # fmt: skip
        self._registry = registry
        self._failures: Counter | None = None  # made when a pool is first shown
        self._set_aside: Gauge | None = None
        self._seen: dict[tuple[int, tuple[str, ...]], int] = {}

    def update(self, engine: RemoteEngine | FailoverEngine) -> None:
        if isinstance(engine, RemoteEngine):
            self.urls(engine.pool_stats())
            return
        self.members(engine.pool_stats())
        for _, member in engine.engines:
            if isinstance(member, RemoteEngine):
                self.urls(member.pool_stats())

    def urls(self, pool: Iterable[UrlStats]) -> None:
        for url in pool:
            self.in_flight.labels(url.url).set(url.in_flight)
            self.healthy.labels(url.url).set(1 if url.healthy else 0)
            self._grow(self.requests, (url.url, "ok"), url.requests - url.failures - url.in_flight)
            self._grow(self.requests, (url.url, "error"), url.failures)
            self._grow(self.ejections, (url.url,), url.ejections)
            self._grow(self.probes, (url.url, "ok"), url.probes - url.probe_failures)
            self._grow(self.probes, (url.url, "error"), url.probe_failures)

    def members(self, pool: Iterable[PoolStats]) -> None:
        if self._failures is None or self._set_aside is None:
            self._failures = Counter("d3router_engine_pool_failures",
                                     "Calls an engine of the pool (engine.pool) could not answer, by engine.",
                                     ("engine",), registry=self._registry)  # fmt: skip
            self._set_aside = Gauge("d3router_engine_pool_set_aside",
                                    "1 while calls skip the pool's engine after a failure of its own, else 0.",
                                    ("engine",), registry=self._registry, multiprocess_mode="liveall")  # fmt: skip
        for member in pool:
            self._grow(self._failures, (member.name,), member.failures)
            self._set_aside.labels(member.name).set(0 if member.set_aside_until is None else 1)

    def _grow(self, counter: Counter, labels: tuple[str, ...], total: int) -> None:
        key = (id(counter), labels)
        child = counter.labels(*labels)  # made at 0, so that a rate() starts from the first scrape
        grown = total - self._seen.get(key, 0)
        if grown > 0:
            child.inc(grown)
            self._seen[key] = total
