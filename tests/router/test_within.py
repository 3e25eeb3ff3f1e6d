"""`within`: a decision's time budget, its timer armed only once the work first waits (a cache hit never does)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router._decision.deadline import within

pytestmark = pytest.mark.anyio


class Timers:
    """Counts the timers armed on the running loop."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        loop = asyncio.get_running_loop()
        call_at = loop.call_at

        def counted(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            self.count += 1
            return call_at(*args, **kwargs)

        monkeypatch.setattr(loop, "call_at", counted)


async def test_work_that_never_waits_arms_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    timers = Timers(monkeypatch)

    async def hit() -> str:
        return "answer"

    assert await within(5, hit()) == "answer"
    assert timers.count == 0


async def test_work_that_waits_gets_its_answer_under_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    timers = Timers(monkeypatch)

    async def miss() -> str:
        await asyncio.sleep(0)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, "late")
        return await future

    assert await within(5, miss()) == "late"
    assert timers.count == 1


async def test_work_over_its_budget_times_out_and_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        await within(0.01, slow())
    assert cancelled.is_set()


async def test_errors_come_through_before_and_after_the_first_wait() -> None:
    async def at_once() -> None:
        raise ValueError("now")

    async def later() -> None:
        await asyncio.sleep(0)
        raise KeyError("later")

    with pytest.raises(ValueError, match="now"):
        await within(5, at_once())
    with pytest.raises(KeyError, match="later"):
        await within(5, later())


async def test_a_cancellation_of_the_caller_reaches_the_work_and_stays_a_cancellation() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(within(5, work()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_a_work_that_swallows_a_cancellation_goes_on() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0)
        return "done anyway"

    task = asyncio.ensure_future(within(5, stubborn()))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    assert await task == "done anyway"
