"""`d3router serve` as a real process, with 1 and 2 workers: every scrape of `/metrics` shows the totals of all the
traffic, whichever worker answers it, and the multi-process directory is gone after the exit."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._proxy import POLICY
from d3backend import free_port
from tests.router._peers import start, stop

REQUESTS = 30
SCRAPES = 6


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[str, str]]:
    """The canned engine (decisions) and the canned upstream, from the benchmarks."""
    engine_port, upstream_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    processes = [start(["-m", "benchmarks._canned", str(engine_port)], f"{engine}/v1/systemone")]
    try:
        processes.append(start(["-m", "benchmarks._upstream", str(upstream_port)], f"{upstream}/chat/completions"))
        yield engine, upstream
    finally:
        for process in processes:
            stop(process)


def totals(text: str) -> dict[str, float]:
    """The sum of each sample name over its series."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def pids(text: str) -> set[str]:
    return {
        sample.labels.get("pid", "")
        for family in text_string_to_metric_families(text)
        if family.name == "process_cpu_seconds"
        for sample in family.samples
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_every_scrape_shows_the_totals(workers: int, backends: tuple[str, str], tmp_path: Path) -> None:
    engine, upstream = backends
    config = tmp_path / "router.yaml"
    config.write_text(f"engine: {{remote: {{urls: ['{engine}'], model: d3-tiny}}}}\n" + POLICY.format(upstream=upstream),
                      encoding="utf-8")  # fmt: skip
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["-m", "router", "serve", str(config), "--port", str(port), "--workers", str(workers),
            "--log-level", "warning"]  # fmt: skip
    router = start(argv, f"{url}/healthz", env={"TMPDIR": str(temp)})
    try:
        if workers > 1:
            assert [path.name.startswith("d3router-metrics-") for path in temp.iterdir()] == [True]
        chat = {"model": "auto", "messages": [{"role": "user", "content": "Write a Python function."}]}
        for _ in range(REQUESTS):  # a new connection each, so that both workers take some
            assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=30).status_code == 200
        seen: set[frozenset[str]] = set()
        for _ in range(SCRAPES):
            response = httpx.get(f"{url}/metrics", timeout=30)
            assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
            sums = totals(response.text)
            assert sums["d3router_requests_total"] == REQUESTS
            assert sums["d3router_decision_seconds_count"] == REQUESTS
            assert sums["d3router_upstream_seconds_count"] == REQUESTS
            assert sums["d3router_decision_cache_total"] == REQUESTS
            assert sums["process_resident_memory_bytes"] > 1e6
            seen.add(frozenset(pids(response.text)))
        if workers == 1:
            assert seen == {frozenset({""})}  # the one process, unlabelled
        else:  # the supervisor and its processes, each by pid, whoever answers
            assert len(seen) == 1
            assert len(next(iter(seen))) >= 3
    finally:
        assert stop(router) == 0
    assert list(temp.iterdir()) == []  # the multi-process directory is removed with the run


def test_a_dead_worker_s_live_gauges_are_dropped(tmp_path: Path) -> None:
    """A worker killed without its exit hook: its cache gauge leaves the sum at the next scrape."""
    from router._observe.metrics import _forget_dead_workers

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
        (tmp_path / f"counter_{pid}.db").write_bytes(b"")
    _forget_dead_workers(str(tmp_path))
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [f"counter_{dead.pid}.db", f"counter_{os.getpid()}.db", f"gauge_livesum_{os.getpid()}.db"]
    )  # a dead worker's counts stay in the totals
