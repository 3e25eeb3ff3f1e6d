"""The Redis rate check runs while a small body is read (router/_faces/limits.py `RedisLimiter.begin`): its verdict is
read before the request is decided, so a caller over its rate reaches no engine and no upstream, and gets its 429
whatever its body; a big body, or one of unknown size, waits for the verdict before it is read."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import pytest
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import ProxyApp, create_app
from router._faces.limits import EARLY_BYTES
from tests.router._redis import RedisServer

pytestmark = pytest.mark.anyio

KEY = "sk-a-0123456789abcdef"
CONFIG = """
server:
  auth: {{keys: [{{name: a, key_env: KEY_A, rate: {{requests: 2, window_s: 60}}}}]}}
  redis: {url}
  sessions: {{salt_env: SALT}}
upstreams: {{small: {{url: http://small.test/v1}}}}
policies:
  auto:
    questions: {{hard: {{type: noul}}}}
    rules: [{{name: hard, when: hard > 0.5, route: small}}, {{name: d, route: small}}]
"""
Events = list[str]


def body(size: int, text: str = "hi") -> bytes:
    """A chat body of `size` bytes, or as few as it can be (its padding in a second message)."""
    messages = [{"role": "user", "content": text}, {"role": "user", "content": ""}]
    raw = json.dumps({"model": "auto", "max_tokens": 5, "messages": messages}).encode()
    messages[1]["content"] = "x" * max(0, size - len(raw))
    return json.dumps({"model": "auto", "max_tokens": 5, "messages": messages}).encode()


@pytest.fixture
async def app(redis_server: RedisServer) -> AsyncIterator[ProxyApp]:
    text = CONFIG.format(url=redis_server.url)
    made = create_app(parse_config(text, "c.yaml"), engine=FakeEngine(), transport=httpx.AsyncHTTPTransport(),
                      environ={"KEY_A": KEY, "SALT": "s"})  # fmt: skip
    try:
        yield made
    finally:
        await made.aclose()


def slowed(app: ProxyApp, events: Events, delay_s: float = 0.02) -> None:
    """The store's scripts take `delay_s` more, their start and end recorded in `events`."""
    run = app.limiter.store.run  # type: ignore[attr-defined]

    async def slow(*args: Any) -> Any:
        events.append("check")
        await asyncio.sleep(delay_s)
        answer = await run(*args)
        events.append("verdict")
        return answer

    app.limiter.store.run = slow  # type: ignore[attr-defined]


async def call(app: ProxyApp, raw: bytes, events: Events, *, length: bool = True, gone: bool = False,
               before_read: Callable[[], Awaitable[None]] | None = None) -> int:  # fmt: skip
    """One POST straight through ASGI; `events` records when the body is read (after `before_read`). `gone`: the
    client leaves instead of sending its body. Returns the answer's status (0 when none was sent)."""
    headers = [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]
    if length:
        headers.append((b"content-length", str(len(raw)).encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http",
             "client": ("127.0.0.1", 1), "server": ("r", 80)}  # fmt: skip
    statuses = []
    sent, answered = [False], asyncio.Event()

    async def receive() -> dict[str, Any]:
        if sent[0]:  # as a server: the client is gone once its answer is
            await answered.wait()
            return {"type": "http.disconnect"}
        if before_read is not None:
            await before_read()
        events.append("read")
        sent[0] = True
        if gone:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        elif not message.get("more_body"):
            answered.set()

    await app(scope, receive, send)
    return statuses[0] if statuses else 0


async def test_a_small_body_is_read_while_redis_answers(app: ProxyApp) -> None:
    events: Events = []
    slowed(app, events)
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={"ok": 1}))
        assert await call(app, body(EARLY_BYTES), events) == 200
    assert events == ["check", "read", "verdict"]


@pytest.mark.parametrize(("size", "length"), [(EARLY_BYTES + 1, True), (100, False)], ids=["big", "unknown size"])
async def test_a_big_body_or_one_of_unknown_size_waits_for_the_verdict(app: ProxyApp, size: int, length: bool) -> None:
    events: Events = []
    slowed(app, events)
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={"ok": 1}))
        assert await call(app, body(size), events, length=length) == 200
    assert events == ["check", "verdict", "read"]


@pytest.mark.parametrize("size", [100, EARLY_BYTES + 1], ids=["small", "big"])
async def test_a_caller_over_its_rate_reaches_no_engine_and_no_upstream(app: ProxyApp, size: int) -> None:
    engine = app.service.engine
    assert isinstance(engine, FakeEngine)
    with respx.mock(assert_all_called=False) as mock:
        upstream = mock.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={}))
        statuses = [await call(app, body(size, f"question {n}"), []) for n in range(4)]
    assert statuses == [200, 200, 429, 429]
    assert (len(engine.calls), upstream.call_count) == (2, 2)  # only the two within the rate were decided and sent


@pytest.mark.parametrize(
    "raw", [b"{not json", b'{"model": "no-such-policy", "messages": []}', body(100)], ids=["bad", "unknown", "good"]
)
async def test_the_429_wins_over_what_the_body_would_get_while_the_check_is_slow(app: ProxyApp, raw: bytes) -> None:
    """The body is read and found bad before the slow verdict arrives: the caller over its rate still gets the 429."""
    for _ in range(2):
        await call(app, body(100), [])
    events: Events = []
    slowed(app, events, delay_s=0.05)
    assert await call(app, raw, events) == 429
    assert events == ["check", "read", "verdict"]


@pytest.mark.parametrize("over", [False, True], ids=["under way", "verdict unread"])
async def test_a_client_gone_before_the_verdict_is_read_leaves_no_task_and_no_log(
    app: ProxyApp, caplog: pytest.LogCaptureFixture, over: bool
) -> None:
    """The client leaves while its check is under way (cancelled), or after its verdict (a 429) came in and before it
    was read (never raised): no answer, no task left running, nothing logged as never retrieved."""
    if over:
        for _ in range(2):
            await call(app, body(100), [])
    events: Events = []
    slowed(app, events, delay_s=0.0 if over else 0.05)

    async def until_verdict() -> None:
        for _ in range(200):
            if "verdict" in events or not over:
                return
            await asyncio.sleep(0.005)

    caplog.set_level(logging.ERROR, logger="asyncio")
    before = asyncio.all_tasks()
    assert await call(app, body(100), events, gone=True, before_read=until_verdict) == 0
    assert events == (["check", "verdict", "read"] if over else ["check", "read"])
    await asyncio.sleep(0.01)
    gc.collect()
    assert asyncio.all_tasks() <= before
    assert not caplog.records, [r.getMessage() for r in caplog.records]
