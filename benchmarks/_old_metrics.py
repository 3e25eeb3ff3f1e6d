"""The hand-written metrics the router had before prometheus_client (the metrics module at a1b3b3a), kept only so
that benchmarks/router.py can measure what the move costs; nothing else imports it."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS_S) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(_LATENCY_BUCKETS_S, seconds)] += 1
        self.sum += seconds


class Metrics:
    """What `/metrics` shows. Label values come from the configuration (policy, rule, upstream names) and from
    a closed set of actions, statuses and error kinds, so the series stay few."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, str, str], int] = defaultdict(int)
        self.engine_errors: defaultdict[str, int] = defaultdict(int)
        self.cache: defaultdict[str, int] = defaultdict(int)
        self.cache_entries: int | None = None  # a gauge, set when the engine has a cache
        self.upstream_errors: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.decision_seconds: defaultdict[str, _Histogram] = defaultdict(_Histogram)
        self.upstream_seconds: defaultdict[str, _Histogram] = defaultdict(_Histogram)

    def request(self, policy: str, rule: str, action: str, status: int) -> None:
        self.requests[(policy, rule, action, str(status))] += 1

    def usage(self, decided: Any) -> None:
        """As the router counts an engine call today (the hit or miss; tokens were not counted before)."""
        self.cache["hit" if decided.cached else "miss"] += 1

    def engine_pool(self, engine: object) -> None:
        """The per engine URL series came later (issue 14.5): not shown here."""

    def follow_engine_pool(self, engine: object) -> None:
        """Nothing to follow (see `engine_pool`)."""

    def render(self) -> str:
        lines: list[str] = []
        _counter(lines, "d3router_requests_total", "Chat requests by policy, rule, action and status.",
                 ("policy", "rule", "action", "status"), self.requests)  # fmt: skip
        _counter(lines, "d3router_engine_errors_total", "Decision engine failures by kind.", ("kind",),
                 {(k,): v for k, v in self.engine_errors.items()})  # fmt: skip
        _counter(lines, "d3router_decision_cache_total", "Decisions answered from the cache (hit) or not (miss).",
                 ("result",), {(k,): v for k, v in self.cache.items()})  # fmt: skip
        if self.cache_entries is not None:
            lines += ["# HELP d3router_decision_cache_entries Decisions held in the cache.",
                      "# TYPE d3router_decision_cache_entries gauge",
                      f"d3router_decision_cache_entries {self.cache_entries}"]  # fmt: skip
        _counter(lines, "d3router_upstream_errors_total", "Upstream attempts that failed, by upstream and kind.",
                 ("upstream", "kind"), self.upstream_errors)  # fmt: skip
        _histogram(lines, "d3router_decision_seconds", "Time to decide (engine call or cache), by policy.",
                   "policy", self.decision_seconds)  # fmt: skip
        _histogram(lines, "d3router_upstream_seconds", "Time to the upstream's response headers, by upstream.",
                   "upstream", self.upstream_seconds)  # fmt: skip
        return "\n".join(lines) + "\n"


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    pairs = ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _counter(lines: list[str], name: str, help_text: str, names: tuple[str, ...], values: Mapping[Any, int]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    lines += [f"{name}{_labels(names, key)} {count}" for key, count in sorted(values.items())]


def _histogram(lines: list[str], name: str, help_text: str, label: str, values: dict[str, _Histogram]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for key, histogram in sorted(values.items()):
        running = 0
        for bound, count in zip((*_LATENCY_BUCKETS_S, float("inf")), histogram.counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'{name}_bucket{{{label}="{_escape(key)}",le="{le}"}} {running}')
        lines.append(f'{name}_sum{{{label}="{_escape(key)}"}} {histogram.sum:.6f}')
        lines.append(f'{name}_count{{{label}="{_escape(key)}"}} {running}')
