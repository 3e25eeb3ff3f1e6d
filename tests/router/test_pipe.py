"""The store's pipelined Redis connection (router/_sessions/pipe.py): RESP read at every cut, replies matched to
their calls in order, scripts by SHA1 and whole after NOSCRIPT, AUTH and SELECT, a dropped connection opened again,
a silent server bounded by the timeout; against a real redis-server where the behaviour is Redis's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import RedisError

from router._observe.metrics import Metrics
from router._sessions.pipe import Pipe, ReplyError, _Incomplete, _Protocol, encode, parse
from router._sessions.store import RedisStore
from tests.router._redis import RedisServer

pytestmark = pytest.mark.anyio

ECHO_ARGS = "return {ARGV[1], tonumber(ARGV[2]), redis.call('GET', KEYS[1])}"


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        (b"+OK\r\n", "OK"),
        (b":-42\r\n", -42),
        (b"$5\r\nhe\r\nl\r\n", "he\r\nl"),  # a bulk string is read by its length, CRLF inside and all
        (b"$0\r\n\r\n", ""),
        (b"$-1\r\n", None),
        (b"*-1\r\n", None),
        (b"*0\r\n", []),
        (b"*3\r\n$1\r\na\r\n$-1\r\n*2\r\n:1\r\n+x\r\n", ["a", None, [1, "x"]]),
        ("$2\r\né\r\n".encode(), "é"),
    ],
)
def test_a_reply_is_read_whole_and_never_from_part_of_it(wire: bytes, value: Any) -> None:
    assert parse(wire) == (value, len(wire))
    assert parse(b"junk" + wire + b"+next\r\n", 4) == (value, 4 + len(wire))
    for cut in range(len(wire)):
        with pytest.raises(_Incomplete):
            parse(wire[:cut])


def test_an_error_reply_is_returned_as_a_redis_error_not_raised() -> None:
    error, end = parse(b"-NOSCRIPT No matching script.\r\n")
    assert isinstance(error, ReplyError) and isinstance(error, RedisError)
    assert str(error) == "NOSCRIPT No matching script."
    assert end == 31


@pytest.mark.parametrize("wire", [b"!3\r\nabc\r\n", b"$3\r\nabcde\r\n", b":x\r\n", b"$y\r\n"])
def test_what_is_not_resp2_is_an_error(wire: bytes) -> None:
    with pytest.raises(ValueError):
        parse(wire)


def test_a_command_is_an_array_of_bulk_strings() -> None:
    assert encode(("EVALSHA", b"\x00\xff", "é")) == b"*3\r\n$7\r\nEVALSHA\r\n$2\r\n\x00\xff\r\n$2\r\n\xc3\xa9\r\n"


class _Wire(asyncio.Transport):
    """A transport that keeps what is written, for the protocol's side alone."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


async def test_replies_fed_a_byte_at_a_time_resolve_their_calls_in_order() -> None:
    protocol, wire = _Protocol(), _Wire()
    protocol.connection_made(wire)
    first, second, third = protocol.send(("GET", "a")), protocol.send(("X",)), protocol.send(("GET", "b"))
    for byte in b"$1\r\n1\r\n-ERR unknown command 'X'\r\n*2\r\n:2\r\n$-1\r\n":
        protocol.data_received(bytes([byte]))
    assert first.result() == "1"
    with pytest.raises(ReplyError, match=r"^ERR unknown command 'X'$"):
        second.result()
    assert third.result() == [2, None]
    assert not protocol.waiting and not protocol.buffer and not wire.aborted


async def test_a_call_given_up_still_has_its_reply_read_so_the_next_gets_its_own() -> None:
    protocol, wire = _Protocol(), _Wire()
    protocol.connection_made(wire)
    given_up, kept = protocol.send(("GET", "a")), protocol.send(("GET", "b"))
    given_up.cancel()
    protocol.data_received(b"+for a\r\n+for b\r\n")
    assert kept.result() == "for b"
    assert not wire.aborted


@pytest.mark.parametrize(
    ("reply", "first", "says"),
    [
        (b"+OK\r\n+more\r\n", "OK", "a reply nobody asked for"),
        (b"%1\r\n", None, "a reply of unknown kind b'%'"),
        (b"$" + str(2 << 20).encode() + b"\r\n" + b"x" * (1 << 20) + b"x", None, "a Redis reply over 1048576 bytes"),
    ],
)
async def test_a_broken_reply_drops_the_connection_and_fails_what_waits(
    reply: bytes, first: str | None, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    protocol, wire = _Protocol(), _Wire()
    protocol.connection_made(wire)
    waiting, after = protocol.send(("GET", "a")), protocol.send(("GET", "b")) if first is None else None
    protocol.data_received(reply)
    assert wire.aborted
    if first is not None:
        assert waiting.result() == first
    else:
        for failed in (waiting, after):
            with pytest.raises(ConnectionError, match=f"^Redis answered what is not RESP: {says}$|^{says}$"):
                failed.result()
    with pytest.raises(ConnectionError, match=r"^the Redis connection is closed$"):
        protocol.send(("GET", "c"))


@pytest.fixture
async def pipe(redis_server: RedisServer) -> AsyncIterator[Pipe]:
    pipe = Pipe(redis_server.url, timeout_s=2.0)
    try:
        yield pipe
    finally:
        await pipe.aclose()


async def test_a_script_is_sent_by_its_sha_and_whole_when_redis_lost_it(redis_server: RedisServer, pipe: Pipe) -> None:
    with redis_server.client() as client:
        client.set("k", "v")
        assert await pipe.script(ECHO_ARGS, ["k"], ["a", "7"]) == ["a", 7, "v"]  # NOSCRIPT, then EVAL
        calls = client.info("commandstats")
        assert calls["cmdstat_eval"]["calls"] == 1 and calls["cmdstat_evalsha"]["calls"] == 1
        assert await pipe.script(ECHO_ARGS, ["k"], ["b", "8"]) == ["b", 8, "v"]  # by its SHA1 alone
        calls = client.info("commandstats")
        assert calls["cmdstat_eval"]["calls"] == 1 and calls["cmdstat_evalsha"]["calls"] == 2
        client.script_flush()
        assert await pipe.script(ECHO_ARGS, ["k"], ["c", "9"]) == ["c", 9, "v"]
        assert client.info("commandstats")["cmdstat_eval"]["calls"] == 2


async def test_a_scripts_own_error_is_raised_as_a_redis_error(pipe: Pipe) -> None:
    with pytest.raises(ReplyError, match=r"oops"):
        await pipe.script("return redis.error_reply('oops')", [], [])
    assert await pipe.call("PING") == "PONG"  # the connection is still good


async def test_a_thousand_calls_in_flight_on_one_connection_each_get_their_own_reply(
    redis_server: RedisServer, pipe: Pipe
) -> None:
    replies = await asyncio.gather(*(pipe.call("ECHO", str(n)) for n in range(1000)))
    assert replies == [str(n) for n in range(1000)]
    with redis_server.client() as client:
        assert client.info("clients")["connected_clients"] == 2  # the pipe's one, and this one


async def test_auth_and_select_are_sent_first_on_each_connection(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.config_set("requirepass", "s3cret")
    url = f"redis://:s3cret@127.0.0.1:{redis_server.port}/3"
    pipe = Pipe(url, timeout_s=2.0)
    try:
        assert await pipe.call("SET", "in-three", "yes") == "OK"
        first = pipe._protocol
        await pipe.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")  # this very connection: the next reconnects
        assert first is not None
        async with asyncio.timeout(5):
            await first.closed  # Redis closed it after its reply
        assert await pipe.call("GET", "in-three") == "yes"
        assert pipe._protocol is not first
    finally:
        await pipe.aclose()
    with Redis(port=redis_server.port, password="s3cret", db=3, decode_responses=True) as client:
        assert client.get("in-three") == "yes"
    wrong = Pipe(f"redis://:nope@127.0.0.1:{redis_server.port}/1", timeout_s=2.0)  # AUTH, then SELECT
    try:
        with pytest.raises(ReplyError, match=r"^WRONGPASS"):
            await wrong.call("PING")
    finally:
        await wrong.aclose()


async def test_a_redis_that_died_fails_the_call_and_a_new_one_is_reached_by_the_next(
    redis_server: RedisServer, pipe: Pipe
) -> None:
    assert await pipe.call("PING") == "PONG"
    redis_server.stop()
    with pytest.raises(OSError):
        await pipe.call("PING")
    with pytest.raises(OSError):  # refused: nothing listens
        await pipe.call("PING")
    redis_server.start()
    assert await pipe.call("PING") == "PONG"


class _Peer:
    """A server of the test's own speaking just enough RESP; each connection's handler is waited for at the end."""

    def __init__(self, answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.answer, self.connections, self.ended = answer, 0, 0
        self.done = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.answer(reader, writer)
            await reader.read()  # until the pipe drops or closes the connection
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.ended += 1
            if self.ended == self.connections:
                self.done.set()

    async def ended_all(self) -> None:
        async with asyncio.timeout(5):
            await self.done.wait()


async def test_a_silent_redis_is_a_timeout_and_the_connection_is_dropped() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pass  # reads, answers nothing

    peer = _Peer(silent)
    server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
    pipe = Pipe(f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0", timeout_s=0.1)
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await pipe.call("PING")
        assert loop.time() - start < 3.0
        await peer.ended_all()  # the pipe dropped it
        with pytest.raises(TimeoutError):
            await pipe.call("PING")
        await peer.ended_all()
        assert peer.connections == 2  # the second call connected again
    finally:
        await pipe.aclose()
        server.close()
        await server.wait_closed()


async def test_a_unix_socket_url_is_reached_by_its_path(tmp_path: Path) -> None:
    async def pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for command, reply in ((("SELECT", "2"), b"+OK\r\n"), (("PING",), b"+PONG\r\n")):
            assert await reader.readexactly(len(encode(command))) == encode(command)
            writer.write(reply)
            await writer.drain()

    peer = _Peer(pong)
    path = tmp_path / "redis.sock"
    server = await asyncio.start_unix_server(peer.handle, str(path))
    pipe = Pipe(f"unix://{path}?db=2", timeout_s=2.0)
    try:
        assert await pipe.call("PING") == "PONG"
    finally:
        await pipe.aclose()
        await peer.ended_all()
        server.close()
        await server.wait_closed()


async def test_a_closed_pipe_refuses_calls(pipe: Pipe) -> None:
    assert await pipe.call("PING") == "PONG"
    await pipe.aclose()
    with pytest.raises(ConnectionError, match=r"^the Redis pipe is closed$"):
        await pipe.call("PING")


async def test_a_pipe_closed_while_it_connects_keeps_no_connection(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, connecting, closed = asyncio.get_running_loop(), asyncio.Event(), asyncio.Event()
    connect = loop.create_connection

    async def slow(*args: Any, **kwargs: Any) -> Any:  # the connection is made once the pipe was closed
        connecting.set()
        await closed.wait()
        return await connect(*args, **kwargs)

    monkeypatch.setattr(loop, "create_connection", slow)
    pipe = Pipe(redis_server.url, timeout_s=5.0)
    call = asyncio.ensure_future(pipe.call("PING"))
    async with asyncio.timeout(5):
        await connecting.wait()
    await pipe.aclose()
    closed.set()
    with pytest.raises(ConnectionError, match=r"^the Redis pipe is closed$"):
        await call
    with redis_server.client() as client:
        async with asyncio.timeout(5):  # until the dropped connection's end reached Redis
            while client.info("clients")["connected_clients"] != 1:  # this one alone
                await asyncio.sleep(0.01)


async def test_a_store_script_takes_no_pool_connection_and_is_never_busy(redis_server: RedisServer) -> None:
    metrics = Metrics()
    store = RedisStore(redis_server.url, timeout_s=0.2, metrics=metrics, max_connections=1)
    try:
        await store._slots.acquire()  # the pool's one connection taken (a slow call of another request's)
        assert await store.run("rate", "return ARGV[1]", [], ["ok"]) == ("answered", "ok")
        assert await store.lookup("k") == ("busy", None)  # a pooled call waits, and is busy
        busy = [line for line in metrics.render().splitlines() if line.startswith("d3router_redis_busy_total")]
        assert busy == ['d3router_redis_busy_total{op="answers_get"} 1.0']
    finally:
        await store.aclose()
