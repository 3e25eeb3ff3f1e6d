"""The soak's router engine keeps nothing per request (issue 24): its fake's record of every call was the RSS growth
`python -m benchmarks.soak` measured, about 240 bytes a request, below the Python objects gc counts."""

from __future__ import annotations

import pytest

from benchmarks._proxy import Counting, engine_for
from d3backend import CachedEngine, FakeEngine, Noul

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("spec", ["fake", "cache"])
async def test_the_soak_engine_keeps_no_record_of_its_calls(spec: str) -> None:
    engine = engine_for(spec)
    counting = engine.engine if isinstance(engine, CachedEngine) else engine
    assert isinstance(counting, Counting)
    fake = counting.engine
    assert isinstance(fake, FakeEngine)
    try:
        for n in range(2000):  # distinct states: each is a cache miss too
            await engine.decide(f"request {n}", {"jailbreak": Noul(None)})
    finally:
        await engine.aclose()
    assert counting.calls == 2000
    assert len(fake.calls) == 0
