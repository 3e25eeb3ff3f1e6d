"""The outbound transport against real sockets: its errors are the ones httpx's own transport raises."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from d3backend import free_port, make_client

pytestmark = pytest.mark.anyio


async def test_refused_connection_is_a_connect_error() -> None:
    async with make_client(timeout=2, connect_timeout=2) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/")


async def test_a_server_that_hangs_up_is_a_protocol_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, make_client(timeout=2, connect_timeout=2) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(f"http://127.0.0.1:{port}/")


async def test_a_silent_server_is_a_read_timeout() -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, make_client(timeout=0.2, connect_timeout=2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"http://127.0.0.1:{port}/")
        release.set()
        await asyncio.sleep(0.05)


async def test_streams_and_bodies_pass_through() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-encoding: identity\r\n\r\nhello")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, family=socket.AF_INET)
    port = server.sockets[0].getsockname()[1]
    async with server, make_client(timeout=2, connect_timeout=2) as client:
        response = await client.get(f"http://127.0.0.1:{port}/")
    assert (response.status_code, response.content) == (200, b"hello")
