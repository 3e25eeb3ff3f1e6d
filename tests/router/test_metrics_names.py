"""The exposition dashboards read: metric names, types, help texts, label names and histogram buckets, pinned to
what the router showed before it moved to prometheus_client (the hand-written router/_observe/metrics.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router._observe.metrics import Metrics

BUCKETS = ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]

# (family, type, help): the `# HELP` and `# TYPE` lines as they were.
FAMILIES = [
    ("d3router_requests", "counter", "Chat requests by policy, rule, action and status."),
    ("d3router_engine_errors", "counter", "Decision engine failures by kind."),
    ("d3router_decision_cache", "counter", "Decisions answered from the cache (hit) or not (miss)."),
    ("d3router_decision_cache_entries", "gauge", "Decisions held in the cache."),
    ("d3router_upstream_errors", "counter", "Upstream attempts that failed, by upstream and kind."),
    ("d3router_decision_seconds", "histogram", "Time to decide (engine call or cache), by policy."),
    ("d3router_upstream_seconds", "histogram", "Time to the upstream's response headers, by upstream."),
    (
        "d3router_engine_tokens",
        "counter",
        "Tokens of engine calls (cache hits not counted): input, of which cached (a hosted model's prompt cache), "
        "and output.",
    ),
]


def filled() -> Metrics:
    """Every family with one series at least, through the call sites router/_faces/proxy.py and _service.py use."""
    metrics = Metrics()
    metrics.request("auto", "code", "route", 200)
    metrics.request("auto", "code", "route", 200)
    metrics.request("auto", "guard", "block", 403)
    metrics.engine_errors["EngineTimeout"] += 1
    metrics.cache["hit"] += 1
    metrics.cache["miss"] += 1
    metrics.cache["miss"] += 1
    metrics.cache_entries = 7
    metrics.upstream_errors[("large", "timeout")] += 1
    metrics.upstream_errors[("large", "503")] += 2
    metrics.decision_seconds["auto"].observe(0.003)
    metrics.decision_seconds["auto"].observe(0.2)
    metrics.upstream_seconds["large"].observe(11.0)
    return metrics


def test_names_types_help_and_labels_are_as_before() -> None:
    text = filled().render()
    for name, kind, help_text in FAMILIES:
        shown = f"{name}_total" if kind == "counter" else name
        assert f"# HELP {shown} {help_text}\n# TYPE {shown} {kind}\n" in text
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("d3router_")}
    assert [(f.name, f.type, f.documentation) for f in families.values()] == FAMILIES
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for family in families.values() for s in family.samples
    }
    assert {key: value for key, value in samples.items() if "_seconds" not in key[0]} == {
        ("d3router_requests_total", (("action", "route"), ("policy", "auto"), ("rule", "code"), ("status", "200"))): 2,
        ("d3router_requests_total", (("action", "block"), ("policy", "auto"), ("rule", "guard"), ("status", "403"))): 1,
        ("d3router_engine_errors_total", (("kind", "EngineTimeout"),)): 1,
        ("d3router_decision_cache_total", (("result", "hit"),)): 1,
        ("d3router_decision_cache_total", (("result", "miss"),)): 2,
        ("d3router_decision_cache_entries", ()): 7,
        ("d3router_upstream_errors_total", (("kind", "timeout"), ("upstream", "large"))): 1,
        ("d3router_upstream_errors_total", (("kind", "503"), ("upstream", "large"))): 2,
    }


def test_histograms_keep_their_buckets_and_labels() -> None:
    families = {family.name: family for family in text_string_to_metric_families(filled().render())}
    decision = families["d3router_decision_seconds"].samples
    buckets = [(s.labels["le"], s.value) for s in decision if s.name == "d3router_decision_seconds_bucket"]
    assert [le for le, _ in buckets] == BUCKETS
    assert [count for _, count in buckets] == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]
    assert {s.name: s.labels for s in decision if not s.name.endswith("_bucket")} == {
        "d3router_decision_seconds_sum": {"policy": "auto"},
        "d3router_decision_seconds_count": {"policy": "auto"},
    }
    totals = {s.name: s.value for s in decision if not s.name.endswith("_bucket")}
    assert totals["d3router_decision_seconds_count"] == 2
    assert abs(totals["d3router_decision_seconds_sum"] - 0.203) < 1e-6
    upstream = families["d3router_upstream_seconds"].samples
    assert {s.labels["upstream"] for s in upstream} == {"large"}
    inf = [s.value for s in upstream if s.labels.get("le") == "+Inf"]
    ten = [s.value for s in upstream if s.labels.get("le") == "10"]
    assert (ten, inf) == ([0], [1])  # 11 s lands above the last bound


def test_nothing_but_the_pinned_series() -> None:
    """No `_created` series or other extras a dashboard never had (process metrics are added apart)."""
    names = {
        s.name
        for family in text_string_to_metric_families(filled().render())
        for s in family.samples
        if family.name.startswith("d3router_")
    }
    assert names == {
        "d3router_requests_total", "d3router_engine_errors_total", "d3router_decision_cache_total",
        "d3router_decision_cache_entries", "d3router_upstream_errors_total", "d3router_decision_seconds_bucket",
        "d3router_decision_seconds_sum", "d3router_decision_seconds_count", "d3router_upstream_seconds_bucket",
        "d3router_upstream_seconds_sum", "d3router_upstream_seconds_count",
    }  # fmt: skip


def test_label_values_are_escaped() -> None:
    metrics = Metrics()
    metrics.request('we"ird\\po\nlicy', "-", "invalid", 400)
    families = list(text_string_to_metric_families(metrics.render()))
    assert [s.labels["policy"] for s in families[0].samples] == ['we"ird\\po\nlicy']


def test_an_unset_cache_gauge_is_not_shown() -> None:
    assert "d3router_decision_cache_entries" not in Metrics().render()


def test_process_metrics_come_with_them() -> None:
    families = {family.name: family for family in text_string_to_metric_families(Metrics().render())}
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"):
        assert [sample.labels for sample in families[name].samples] == [{}]  # one process: no pid label
    assert families["process_resident_memory_bytes"].samples[0].value > 1e6


def test_a_new_counter_family_has_the_same_shape() -> None:
    metrics = Metrics()
    invalid = metrics.counter("d3router_engine_invalid_answers", "Engine answers that broke the contract.", ["reason"])
    invalid["nan"] += 1
    invalid["nan"] += 2
    assert "nan" in invalid
    assert 'd3router_engine_invalid_answers_total{reason="nan"} 3.0\n' in metrics.render()
