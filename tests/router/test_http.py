"""The client-disconnect watcher: the client leaving cancels the work; any other cancellation goes through."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive

from router._http import cancel_on_disconnect

pytestmark = pytest.mark.anyio


def client() -> tuple[asyncio.Queue[Message], Receive]:
    queue: asyncio.Queue[Message] = asyncio.Queue()

    async def receive() -> Message:
        return await queue.get()

    return queue, receive


async def test_the_client_leaving_cancels_the_work_and_the_handler_returns() -> None:
    queue, receive = client()
    cancelled = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(cancel_on_disconnect(receive, work))
    await asyncio.sleep(0.01)
    await queue.put({"type": "http.disconnect"})
    await asyncio.wait_for(task, 1)  # returns, no CancelledError
    assert cancelled.is_set()
    assert task.cancelling() == 0


async def test_work_that_swallows_the_cancellation_leaves_the_task_uncancelled() -> None:
    queue, receive = client()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # e.g. a library that catches it

    async def handler() -> int:
        await cancel_on_disconnect(receive, work)
        current = asyncio.current_task()
        assert current is not None
        await asyncio.sleep(0)  # a pending cancellation would strike here
        return current.cancelling()

    task = asyncio.create_task(handler())
    await asyncio.sleep(0.01)
    await queue.put({"type": "http.disconnect"})
    assert await asyncio.wait_for(task, 1) == 0


async def test_a_cancellation_from_outside_is_not_swallowed() -> None:
    _, receive = client()
    finished = asyncio.Event()

    async def work() -> None:
        await asyncio.sleep(10)
        finished.set()

    task = asyncio.create_task(cancel_on_disconnect(receive, work))
    await asyncio.sleep(0.01)
    task.cancel()  # the server shutting down, say
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not finished.is_set()


async def test_other_messages_are_read_past_and_the_watcher_stops_with_the_work() -> None:
    queue, receive = client()
    await queue.put({"type": "http.request", "body": b"", "more_body": False})
    before = len(asyncio.all_tasks())

    async def work() -> None:
        await asyncio.sleep(0.01)

    await cancel_on_disconnect(receive, work)
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before  # the watcher is gone
