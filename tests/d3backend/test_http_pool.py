"""A transport's own connection limit over real sockets: a request that finds every connection busy waits the
short pool timeout and gets `httpx.PoolTimeout`, not the upstream's read timeout; a slot comes back when its
response is closed or its request fails."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from d3backend import _http, free_port, make_transport, outbound_request

pytestmark = pytest.mark.anyio

READ_TIMEOUT_S = 30.0
POOL_TIMEOUT_S = 0.2


@pytest.fixture(params=["aiohttp", "httpx"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(_http, "TRANSPORT", request.param)
    return str(request.param)


@pytest.fixture
async def hanging() -> AsyncIterator[tuple[str, asyncio.Event, list[int]]]:
    """A server that answers a request's head only once `release` is set; counts the requests that reached it."""
    release = asyncio.Event()
    arrived: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                arrived.append(1)
                await release.wait()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x", release, arrived
        release.set()


def request(url: str) -> httpx.Request:
    return outbound_request("GET", url, headers={}, content=None, timeout_s=READ_TIMEOUT_S, connect_timeout_s=5)


async def wait_for(condition: object) -> None:
    for _ in range(500):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def test_the_third_request_gets_a_pool_timeout_not_the_read_timeout(
    kind: str, hanging: tuple[str, asyncio.Event, list[int]]
) -> None:
    url, release, arrived = hanging
    transport = make_transport(max_connections=2, pool_timeout_s=POOL_TIMEOUT_S)
    busy = [asyncio.create_task(transport.handle_async_request(request(url))) for _ in range(2)]
    await wait_for(lambda: len(arrived) == 2)
    start = time.monotonic()
    with pytest.raises(httpx.PoolTimeout):
        await transport.handle_async_request(request(url))
    assert time.monotonic() - start < READ_TIMEOUT_S / 10  # the pool's wait, far from the read timeout
    assert len(arrived) == 2  # the third never went out
    release.set()
    for task in busy:
        response = await task
        assert await response.aread() == b"ok"  # closes it: its connection is free again
    response = await transport.handle_async_request(request(url))
    assert await response.aread() == b"ok"
    await transport.aclose()


async def test_a_waiting_request_takes_the_connection_a_closed_response_frees(
    hanging: tuple[str, asyncio.Event, list[int]],
) -> None:
    url, release, arrived = hanging
    transport = make_transport(max_connections=1, pool_timeout_s=READ_TIMEOUT_S)
    first = asyncio.create_task(transport.handle_async_request(request(url)))
    await wait_for(lambda: len(arrived) == 1)
    second = asyncio.create_task(transport.handle_async_request(request(url)))
    await asyncio.sleep(0.05)
    assert (len(arrived), second.done()) == (1, False)  # waiting for the one connection
    release.set()
    await (await first).aclose()
    assert await (await second).aread() == b"ok"
    await transport.aclose()


async def test_a_failed_request_gives_its_connection_back(kind: str) -> None:
    transport = make_transport(max_connections=1, pool_timeout_s=POOL_TIMEOUT_S)
    for _ in range(3):  # each would time out on the pool if the first had kept its slot
        with pytest.raises(httpx.ConnectError):
            await transport.handle_async_request(request(f"http://127.0.0.1:{free_port()}/"))
    await transport.aclose()


async def test_without_a_pool_timeout_the_request_s_own_applies(hanging: tuple[str, asyncio.Event, list[int]]) -> None:
    url, _, arrived = hanging
    transport = make_transport(max_connections=1)
    busy = asyncio.create_task(transport.handle_async_request(request(url)))
    await wait_for(lambda: len(arrived) == 1)
    short = outbound_request("GET", url, headers={}, content=None, timeout_s=POOL_TIMEOUT_S, connect_timeout_s=5)
    with pytest.raises(httpx.PoolTimeout):
        await transport.handle_async_request(short)
    busy.cancel()
    await transport.aclose()


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections must be at least 1, not 0"):
        make_transport(max_connections=0)
