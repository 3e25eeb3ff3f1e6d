"""Clients that leave: mid-body (a quiet end), or while the upstream works (the watcher cancels the work; any
other cancellation goes through)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from d3backend import FakeEngine
from policies import parse_config
from router import D3RouterMiddleware, create_app
from router._asgi.messages import ClientDisconnected, cancel_on_disconnect, read_body

CONFIG = """
upstreams: {chat: {url: "http://upstream.test/v1"}}

policies:
  auto:
    questions: {kind: {type: choice, criteria: {code: Writing code, chat: Anything else}}}
    rules: [{name: default, route: chat}]
"""

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


def partial_body_then_gone() -> Receive:
    messages: list[Message] = [{"type": "http.request", "body": b'{"model": "au', "more_body": True},
                               {"type": "http.disconnect"}]  # fmt: skip

    async def receive() -> Message:
        return messages.pop(0)

    return receive


async def test_a_client_gone_mid_body_is_a_quiet_end_not_an_error() -> None:
    # Before: read_body raised CancelledError, which uvicorn logged as "Exception in ASGI application".
    with pytest.raises(ClientDisconnected):
        await read_body(partial_body_then_gone(), 1 << 20)

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    config = parse_config("server: {passthrough: [/v1/embeddings]}\n" + CONFIG, "c.yaml")
    app = create_app(config, engine=FakeEngine({"kind": "chat"}), transport=httpx.AsyncHTTPTransport())
    inner_called = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        inner_called.append(scope["path"])

    middleware = D3RouterMiddleware(inner, config=config, engine=FakeEngine({"kind": "chat"}))
    for asgi, path in ((app, "/v1/chat/completions"), (app, "/v1/embeddings"), (middleware, "/v1/chat/completions")):
        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "headers": [(b"content-type", b"application/json")]}  # fmt: skip
        await asgi(scope, partial_body_then_gone(), send)  # returns, raises nothing
    assert sent == [] and inner_called == []
    await app.aclose()


async def test_a_body_over_the_limit_gets_one_413_everywhere() -> None:
    config = parse_config("server: {max_body_bytes: 1024, passthrough: [/v1/embeddings]}\n" + CONFIG, "c.yaml")
    app = create_app(config, engine=FakeEngine({"kind": "chat"}), transport=httpx.AsyncHTTPTransport())

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the app behind the middleware must not see it")

    middleware = D3RouterMiddleware(inner, config=config, engine=FakeEngine({"kind": "chat"}))
    answers = []
    for asgi, path in ((app, "/v1/chat/completions"), (app, "/v1/embeddings"), (middleware, "/v1/chat/completions")):
        sent: list[Message] = []
        messages: list[Message] = [{"type": "http.request", "body": b"x" * 1025, "more_body": False}]

        async def receive(messages: list[Message] = messages) -> Message:
            return messages.pop(0)

        async def send(message: Message, sent: list[Message] = sent) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "headers": [(b"content-type", b"application/json")]}  # fmt: skip
        await asgi(scope, receive, send)
        answers.append((sent[0]["status"], json.loads(sent[1]["body"])["error"]["message"]))
    assert answers == [(413, "the request body is over 1024 bytes (server.max_body_bytes)")] * 3
    await app.aclose()
