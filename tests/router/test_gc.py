"""The garbage collector kept out of the tail (issue 31.5): `settle()` freezes start-up's objects and raises the
young threshold, `Pauses` shows every collection in the metrics, `d3router serve` does both once started."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from policies import load_config
from router import D3RouterMiddleware, ProxyApp
from router._faces import serve
from router._observe import gcpauses
from router._observe.metrics import Metrics

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    """The collector as it was before the test (thresholds, frozen objects, callbacks), whatever the test did."""
    threshold, callbacks = gc.get_threshold(), list(gc.callbacks)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
        gc.callbacks[:] = callbacks


def samples(metrics: Metrics, name: str) -> dict[str, float]:
    """`name`'s samples by their generation label."""
    return {sample.labels["generation"]: sample.value for family in text_string_to_metric_families(metrics.render())
            for sample in family.samples if sample.name == name}  # fmt: skip


def test_settle_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    gc.unfreeze()
    kept = [{"alive": i} for i in range(100)]  # tracked objects alive at start-up
    gc.set_threshold(700, 10, 10)
    gcpauses.settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (gcpauses.GEN0_THRESHOLD, 10, 10)  # the older generations keep theirs
    assert gcpauses.GEN0_THRESHOLD > 700


def test_a_forced_collection_is_timed_and_counted_by_generation() -> None:
    metrics = Metrics()
    pauses = gcpauses.Pauses(metrics).install()
    assert samples(metrics, "d3router_gc_collections_total") == {"0": 0, "1": 0, "2": 0}  # shown from the start
    gc.collect()
    gc.collect(0)
    counted = samples(metrics, "d3router_gc_collections_total")  # a scrape moves what was recorded in
    timed = samples(metrics, "d3router_gc_pause_seconds_count")
    assert counted["2"] >= 1 and counted["0"] >= 1
    assert timed["2"] == counted["2"] and timed["0"] == counted["0"]
    assert samples(metrics, "d3router_gc_pause_seconds_sum")["2"] > 0
    assert pauses.window()["collections"][2] >= 1
    pauses.uninstall()
    assert pauses._callback not in gc.callbacks
    gc.collect()
    assert samples(metrics, "d3router_gc_collections_total")["2"] == counted["2"]  # no longer recorded


async def test_serve_settles_once_started_and_records_until_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("upstreams: {small: {url: 'http://127.0.0.1:9/v1'}}\n"
                    "policies: {auto: {rules: [{name: default, route: small}]}}\n", encoding="utf-8")  # fmt: skip
    settled: list[str] = []
    monkeypatch.setattr(gcpauses, "settle", lambda: settled.append("settled"))
    seen: dict[str, Any] = {}

    async def started(app: ProxyApp, *args: Any, **kwargs: Any) -> int:
        """uvicorn's part: the app's startup, a collection while it serves, its close."""
        assert not settled  # not before the app has started
        await app.startup()
        gc.collect()
        seen["collections"] = samples(app.service.metrics, "d3router_gc_collections_total")
        await app.aclose()
        return 0

    monkeypatch.setattr(serve, "serve_app", started)
    before = list(gc.callbacks)
    assert await serve.serve(load_config(path), "127.0.0.1", 0) == 0
    assert settled == ["settled"]
    assert seen["collections"]["2"] >= 1
    assert gc.callbacks == before  # the app's close stopped the recording


def test_resettle_frees_the_cycles_a_reload_left_frozen_and_freezes_what_is_alive() -> None:
    class Node:
        pass

    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    old = Node()
    old.me = old  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    gcpauses.settle()
    seen = weakref.ref(old)
    del old
    gc.collect()
    assert seen() is not None  # frozen: no collection reaches it
    kept = [{"new": i} for i in range(100)]
    gcpauses.resettle()
    assert seen() is None
    collected = {id(o) for o in gc.get_objects()}  # the generations the collector walks: never the frozen
    assert not any(id(new) in collected for new in kept)
    assert gc.get_threshold()[0] == gcpauses.GEN0_THRESHOLD


async def test_a_reload_resettles_once_the_replaced_configuration_served_its_last_request(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("upstreams: {small: {url: 'http://127.0.0.1:9/v1'}}\n"
                    "policies: {auto: {rules: [{name: default, route: small}]}}\n", encoding="utf-8")  # fmt: skip
    resettled: list[str] = []
    async with ProxyApp(load_config(path)) as app:
        app.resettle = lambda: resettled.append("resettled")
        in_flight = app.enter()  # a request served under the configuration being replaced
        path.write_text(path.read_text(encoding="utf-8").replace("auto", "other"), encoding="utf-8")
        assert (await app.areload()).ok
        await asyncio.sleep(0.01)
        assert resettled == []  # not while the old configuration still serves
        in_flight.leave()
        for _ in range(100):
            if resettled:
                break
            await asyncio.sleep(0.01)
        assert resettled == ["resettled"]


def test_the_middleware_settles_only_when_asked_and_records_until_its_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("upstreams: {small: {url: 'http://127.0.0.1:9/v1'}}\n"
                    "policies: {auto: {rules: [{name: default, route: small}]}}\n", encoding="utf-8")  # fmt: skip
    settled: list[str] = []
    monkeypatch.setattr(gcpauses, "settle", lambda: settled.append("settled"))
    before = list(gc.callbacks)
    for asked in (False, True):
        middleware = Middleware(D3RouterMiddleware, config=str(path), settle_gc=asked)
        app = Starlette(middleware=[middleware])
        with TestClient(app):  # runs the lifespan
            assert settled == (["settled"] if asked else [])
            assert len(gc.callbacks) == len(before) + asked  # the pauses recorded while it serves
        assert gc.callbacks == before  # its shutdown stopped the recording
