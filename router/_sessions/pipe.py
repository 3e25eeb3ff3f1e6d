"""One pipelined Redis connection for the store's Lua scripts (rate limits, budgets): commands written at once,
replies read in order, no pool.

    pipe = Pipe("redis://127.0.0.1:6379/0", timeout_s=0.05)
    wait = await pipe.script(SCRIPT, keys=["d3:rate:{key:alice}"], args=["1733400000.0", "0.1", "0.9"])
    await pipe.aclose()

Why not redis-py's client here: each request with a rate limit or a budget runs a script before it goes upstream, so
its round trip is on every such request's path. Measured on 2 cores beside the router benchmark's key rows
(benchmarks/_redisfloor.py, the rate limit's script with two limits, one call at a time, 2026-12-06): redis-py's
asyncio client 0.299 ms p50 and 0.218 ms of the event loop's CPU a call; this connection 0.215 ms and 0.113 ms.
The rest of the store (sessions, the shared decision cache) keeps redis-py's pooled client.
tests/router/test_pipe.py checks it against a real redis-server, and the router benchmark's Redis rows
(benchmarks/_keyrows.py) measure it on the request path.

How it works: `asyncio.Protocol` over one socket. A call writes its command to the socket before it returns its
future (nothing waits for a free connection: a slow Redis shows as the store's timeout, not as a queue here), and
each reply resolves the oldest waiting future. A call that timed out still has its reply read, and dropped, so the
order holds. The connection is dropped on a timeout (Redis may be gone without a word) and on any protocol error,
failing what waits on it; the next call connects again. Replies are RESP2: bulk strings come back as `str`, arrays
as lists (nil as None), integers as `int`, an error reply raises `ReplyError` (a redis-py `RedisError`, so the store
takes it for the failure it is). A script is sent by its SHA1 (EVALSHA), and once again whole (EVAL) when Redis
answers NOSCRIPT (a restarted or flushed server).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Awaitable
from typing import Any

from redis.asyncio.connection import SSLConnection, parse_url
from redis.exceptions import RedisError

MAX_REPLY_BYTES = 1 << 20  # a reply larger than this is no answer to our scripts: the connection is dropped


class ReplyError(RedisError):
    """Redis answered with an error (`-ERR ...`, `-NOSCRIPT ...`, `-CROSSSLOT ...`)."""


class _Incomplete(Exception):
    """The buffer ends inside a reply: wait for more bytes."""


def encode(args: tuple[str | bytes, ...]) -> bytes:
    """A command as RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse(buffer: bytes | bytearray, start: int = 0) -> tuple[Any, int]:
    """The reply that starts at `start`, and where the next one starts; `_Incomplete` when it has not all arrived,
    `ValueError` when it is not RESP2. An error reply is returned as a `ReplyError`, not raised."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        raise _Incomplete
    kind, line = buffer[start : start + 1], bytes(buffer[start + 1 : end])
    after = end + 2
    if kind == b"+":
        return line.decode(errors="replace"), after
    if kind == b"-":
        return ReplyError(line.decode(errors="replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            raise _Incomplete
        if buffer[after + size : after + size + 2] != b"\r\n":
            raise ValueError("a bulk string without its CRLF")
        return bytes(buffer[after : after + size]).decode(errors="replace"), after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            item, after = parse(buffer, after)
            items.append(item)
        return items, after
    raise ValueError(f"a reply of unknown kind {bytes(kind)!r}")


class _Protocol(asyncio.Protocol):
    """The socket's side: replies read in order, each resolving the oldest waiting future."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.buffer = bytearray()
        self.closed = asyncio.get_running_loop().create_future()

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self.closed.done()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport: create_connection's

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        start = 0
        try:
            while start < len(self.buffer):
                reply, start = parse(self.buffer, start)
                if not self.waiting:
                    raise ValueError("a reply nobody asked for")
                future = self.waiting.popleft()
                if future.done():  # timed out: its reply is read and dropped, so that the next one is the next's
                    continue
                if isinstance(reply, ReplyError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except _Incomplete:
            if len(self.buffer) - start > MAX_REPLY_BYTES:
                self.drop(ConnectionError(f"a Redis reply over {MAX_REPLY_BYTES} bytes"))
        except ValueError as exc:
            self.drop(ConnectionError(f"Redis answered what is not RESP: {exc}"))
        del self.buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionError("the Redis connection was closed") if exc is None else exc)
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self, exc: Exception) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)

    def drop(self, exc: Exception) -> None:
        self.fail(exc)
        if self.transport is not None:
            self.transport.abort()

    def send(self, args: tuple[str | bytes, ...]) -> asyncio.Future[Any]:
        transport = self.transport
        if transport is None or not self.usable:
            raise ConnectionError("the Redis connection is closed")
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        transport.write(encode(args))
        return future


class Pipe:
    """One pipelined connection to the Redis at `url` (redis://, rediss://, unix://, with a user, password and db as
    redis-py reads them), opened at the first call and again after it was dropped."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._options = parse_url(url)
        self._protocol: _Protocol | None = None
        self._connecting = asyncio.Lock()
        self._shas: dict[str, str] = {}
        self._closed = False

    async def script(self, script: str, keys: list[str], args: list[str]) -> Any:
        """Run a Lua `script` (by its SHA1; whole once more when Redis does not have it) and return its reply."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        return await self._within(self._script(sha, script, (str(len(keys)), *keys, *args)))

    async def call(self, *args: str | bytes) -> Any:
        """Send one command and return its reply."""
        return await self._within(self._send(args))

    async def _within(self, work: Awaitable[Any]) -> Any:
        """`work`'s reply, or TimeoutError after `timeout_s` (connecting included), the connection then dropped."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await work
        except TimeoutError:
            if self._protocol is not None:
                self._protocol.drop(TimeoutError(f"no answer from Redis within {self.timeout_s} s"))
            raise

    async def _script(self, sha: str, script: str, rest: tuple[str, ...]) -> Any:
        try:
            return await self._send(("EVALSHA", sha, *rest))
        except ReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self._send(("EVAL", script, *rest))

    async def _send(self, args: tuple[str | bytes, ...]) -> Any:
        protocol = self._protocol
        if protocol is None or not protocol.usable:
            protocol = await self._connect()
        return await protocol.send(args)

    async def _connect(self) -> _Protocol:
        async with self._connecting:  # one connection at a time, whatever the number of calls waiting for it
            if self._closed:
                raise ConnectionError("the Redis pipe is closed")
            if self._protocol is not None and self._protocol.usable:
                return self._protocol
            loop, options = asyncio.get_running_loop(), self._options
            if "path" in options:
                _, protocol = await loop.create_unix_connection(_Protocol, options["path"])
            else:
                _, protocol = await loop.create_connection(
                    _Protocol, options.get("host", "localhost"), options.get("port", 6379), ssl=self._tls()
                )
            if self._closed:  # closed while connecting
                protocol.drop(ConnectionError("the Redis pipe is closed"))
                raise ConnectionError("the Redis pipe is closed")
            self._protocol = protocol  # dropped by `_within` if what follows does not answer in time
            hello: list[tuple[str, ...]] = []
            if options.get("password") is not None:
                user = options.get("username")
                hello.append(("AUTH", options["password"]) if user is None else ("AUTH", user, options["password"]))
            if options.get("db", 0):
                hello.append(("SELECT", str(options["db"])))
            try:
                await asyncio.gather(*(protocol.send(command) for command in hello))  # the rest's errors retrieved
            except ReplyError as exc:
                protocol.drop(ConnectionError(f"Redis refused the connection's AUTH or SELECT: {exc}"))
                raise
            return protocol

    def _tls(self) -> ssl.SSLContext | None:
        options = self._options
        if options.get("connection_class") is not SSLConnection:
            return None
        cafile = options.get("ssl_ca_certs")
        context = ssl.create_default_context(cafile=None if cafile is None else str(cafile))
        if options.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context

    async def aclose(self) -> None:
        """Close the connection (what waits on it fails) and refuse new calls."""
        self._closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.abort()  # nothing buffered is worth a wait on a peer that may not read
            await protocol.closed
