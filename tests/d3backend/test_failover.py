"""`FailoverEngine` (issue 28.2): engines tried in order, the answering one named, a failing one set aside."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
import pytest
import respx

from d3backend import (
    CachedEngine,
    Choice,
    DecisionsEngine,
    EngineError,
    EngineRejected,
    EngineTimeout,
    EngineUnavailable,
    FailoverEngine,
    FakeEngine,
    Noul,
    Question,
    RemoteEngine,
    answer_wire,
    decode_decided,
    encode_decided,
)
from tests.decisions_server import DecisionsServer

pytestmark = pytest.mark.anyio

QUESTIONS: Mapping[str, Question] = {"code": Noul("Is this about code?")}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(*engines: FakeEngine, clock: Clock | None = None, **kwargs: object) -> FailoverEngine:
    named = [(engine.model, engine) for engine in engines]
    return FailoverEngine(named, timer=clock or Clock(), **kwargs)  # type: ignore[arg-type]


async def test_the_first_engine_answers_and_is_named() -> None:
    first, second = FakeEngine({"code": 0.9}, model="d3"), FakeEngine({"code": 0.1}, model="luna")
    async with pool(first, second) as engine:
        decided = await engine.decide("Fix my SQL", QUESTIONS)
    assert (decided.engine, decided.answers["code"].probabilities["yes"]) == ("d3", 0.9)
    assert len(first.calls) == 1 and not second.calls
    assert first.closed and second.closed  # the pool owns its engines


async def test_when_the_first_fails_the_second_answers() -> None:
    first = FakeEngine(model="d3", error=EngineUnavailable("down"))
    second = FakeEngine({"code": 0.2}, model="luna")
    async with pool(first, second) as engine:
        decided = await engine.decide("Fix my SQL", QUESTIONS)
        assert [(s.name, s.answers, s.failures) for s in engine.pool_stats()] == [("d3", 0, 1), ("luna", 1, 0)]
    assert decided.engine == "luna" and decided.model == "luna"
    assert decided.answers["code"].probabilities["yes"] == 0.2


async def test_a_failed_engine_is_set_aside_then_tried_again() -> None:
    clock = Clock()
    first = FakeEngine({"code": 0.9}, model="d3", error=EngineTimeout("slow"))
    second = FakeEngine({"code": 0.2}, model="luna")
    async with pool(first, second, clock=clock, set_aside_s=5.0) as engine:
        await engine.decide("a", QUESTIONS)
        assert engine.pool_stats()[0].set_aside_until == 105.0
        await engine.decide("b", QUESTIONS)
        assert len(first.calls) == 1  # skipped while set aside
        clock.now = 105.0
        first.error = None
        decided = await engine.decide("c", QUESTIONS)
    assert decided.engine == "d3" and len(first.calls) == 2 and len(second.calls) == 2


async def test_a_rejected_request_fails_over_but_sets_nothing_aside() -> None:
    first = FakeEngine(model="d3", error=EngineRejected(400, "no videos"))
    second = FakeEngine({"code": 0.2}, model="luna")
    async with pool(first, second) as engine:
        assert (await engine.decide("a", QUESTIONS)).engine == "luna"
        assert engine.pool_stats()[0].set_aside_until is None
        await engine.decide("b", QUESTIONS)
    assert len(first.calls) == 2


async def test_when_every_engine_fails_the_last_error_is_raised_and_all_are_tried_again() -> None:
    first = FakeEngine(model="d3", error=EngineUnavailable("d3 down"))
    second = FakeEngine(model="luna", error=EngineTimeout("luna slow"))
    async with pool(first, second) as engine:
        with pytest.raises(EngineTimeout, match=r"^luna slow$"):
            await engine.decide("a", QUESTIONS)
        with pytest.raises(EngineError, match=r"^luna slow$"):  # both set aside: both tried anyway, in order
            await engine.decide("b", QUESTIONS)
    assert len(first.calls) == 2 and len(second.calls) == 2


async def test_each_engine_has_its_own_deadline() -> None:
    slow = FakeEngine({"code": 0.9}, model="d3", delay_s=30.0)
    fast = FakeEngine({"code": 0.2}, model="luna")
    engine = FailoverEngine([("d3", slow), ("luna", fast)], timeouts_s=[0.01, None])
    async with engine:
        decided = await engine.decide("a", QUESTIONS)
        assert decided.engine == "luna"
        assert engine.pool_stats()[0].set_aside_until is not None  # a timeout is the engine's own trouble


async def test_a_lone_slow_engine_times_out_as_an_engine_timeout() -> None:
    engine = FailoverEngine([("d3", FakeEngine(model="d3", delay_s=30.0))], timeouts_s=[0.01])
    async with engine:
        with pytest.raises(EngineTimeout, match=r"^the engine 'd3' did not answer within 0.01 s$"):
            await engine.decide("a", QUESTIONS)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engines": []}, r"^FailoverEngine needs at least one engine$"),
        ({"engines": [("a", FakeEngine()), ("a", FakeEngine())]}, r"^FailoverEngine's engines need distinct names"),
        ({"engines": [("a", FakeEngine())], "timeouts_s": [1.0, 2.0]}, r"^FailoverEngine needs one timeout per"),
        ({"engines": [("a", FakeEngine())], "set_aside_s": -1.0}, r"^set_aside_s must be 0 or more seconds"),
    ],
    ids=["empty", "names", "timeouts", "set-aside"],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FailoverEngine(**kwargs)  # type: ignore[arg-type]


async def test_the_cache_in_front_keys_by_the_pool_and_keeps_the_answering_engine() -> None:
    first = FakeEngine(model="d3", error=EngineUnavailable("down"))
    second = FakeEngine({"code": 0.2}, model="luna")
    async with CachedEngine(pool(first, second)) as cached:
        assert cached.model == "pool(d3,luna)"  # never the key of d3 alone
        await cached.decide("a", QUESTIONS)
        hit = await cached.decide("a", QUESTIONS)
    assert (hit.cached, hit.engine) == (True, "luna")
    assert decode_decided(encode_decided(hit), QUESTIONS) == hit._replace(cached=False, elapsed_ms=0.0)


async def test_probe_is_the_first_engine_that_answers() -> None:
    first = FakeEngine(model="d3", error=EngineUnavailable("down"))
    async with pool(first, FakeEngine(model="luna")) as engine:
        probed = await engine.probe()
    assert probed is not None and probed.engine == "luna"


async def test_probe_each_probes_every_engine_and_names_each_error() -> None:
    class Bare:  # an engine with no probe is taken as answering it
        model = "bare"

        async def decide(self, *args: object, **kwargs: object) -> object:
            raise AssertionError("not asked")

        async def aclose(self) -> None:
            pass

    broken = EngineRejected(401, "the key is wrong")
    d3, luna = FakeEngine(model="d3"), FakeEngine(model="luna", error=broken)
    async with FailoverEngine([("d3", d3), ("luna", luna), ("bare", Bare())]) as engine:  # type: ignore[list-item]
        probed = await engine.probe_each()
        ready = await engine.probe()
    assert probed == (("d3", None), ("luna", broken), ("bare", None))
    assert ready is not None and ready.engine == "d3"  # the pool's own probe stops at the first that answers


async def test_remote_d3_down_then_a_decisions_engine_answers_over_http() -> None:
    """The kinds mixed for real: a vLLM URL refusing connections, then a Decisions server (checked by the SDK's
    types)."""
    server = DecisionsServer({"code": 0.3, "kind": "chat"})
    questions: Mapping[str, Question] = {**QUESTIONS, "kind": Choice(None, {"code": None, "chat": None})}
    with respx.mock() as mock:
        mock.post("http://d3.test/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
        remote = RemoteEngine(["http://d3.test"], model="d3", transport=httpx.MockTransport(mock.async_handler))
        hosted = DecisionsEngine("http://luna.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server))
        async with FailoverEngine([("remote", remote), ("decisions", hosted)]) as engine:
            decided = await engine.decide("Hello there", questions)
    assert decided.engine == "decisions" and decided.model == "luna-test"
    assert decided.answers["kind"].probabilities == {"code": 0.0, "chat": 1.0}
    assert answer_wire(decided.answers["code"])["noul"] == pytest.approx(0.3)
    assert len(server.requests) == 1


async def test_a_cancelled_call_sets_nothing_aside() -> None:
    slow = FakeEngine({"code": 0.9}, model="d3", delay_s=30.0)
    async with pool(slow, FakeEngine(model="luna")) as engine:
        task = asyncio.ensure_future(engine.decide("a", QUESTIONS))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [s.failures for s in engine.pool_stats()] == [0, 0]
