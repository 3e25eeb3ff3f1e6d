"""The decision's deadline: `within(timeout_s, work)` arms its timer only once `work` first waits."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

logger = logging.getLogger(__name__)


T = TypeVar("T")


async def within(timeout_s: float, work: Coroutine[Any, Any, T]) -> T:
    """`await work` under `asyncio.timeout(timeout_s)`, the timer armed only once `work` first waits: a decision
    from the cache returns without ever waiting, and arming and cancelling a timer for it was a twelfth of a cache
    hit's time in the proxy (benchmarks/router.py). A `work` that waits gets the whole budget from that moment."""
    try:
        waiting = work.send(None)  # run it up to its first wait, as the task itself would
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except BaseException:
        work.close()
        raise
    async with asyncio.timeout(timeout_s):
        return await _go_on(work, waiting)


@types.coroutine
def _go_on(work: Coroutine[Any, Any, T], waiting: Any) -> Generator[Any, Any, T]:
    """Go on with `work`, stopped at its first wait on `waiting`: hand what it waits on to the task, and the task's
    answer (a value, a cancellation) back to it, as `await` would."""
    while True:
        try:
            value = yield waiting
        except GeneratorExit:
            work.close()
            raise
        except BaseException as exc:  # the task's cancellation goes on into `work`
            try:
                waiting = work.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            continue
        try:
            waiting = work.send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
