"""Shared state behind one small protocol: an in-process bounded store, or Redis shared by replicas.

    store = build_store(config.server, metrics)        # chosen once, at start
    await store.set("session:3f9a...", "large,small", ttl_s=3600)
    await store.get("session:3f9a...")                 # "large,small", or None
    engine = CachedEngine(inner, shared=shared_answers(store, metrics, salt))   # Redis: a second-level decision cache

Keys are hashed by the caller and values are upstream names or a decision's answers (probabilities, by a digest of
the decision's content): a store never holds a prompt or a body.

`RedisStore` writes through to an in-process store and answers from it whenever Redis is slow or down (issue 24.4):

- The pool blocks: at most `server.redis_max_connections` (32) calls hold a connection at once; one more waits for a
  free one, at most `server.redis_timeout_s`. A wait that runs out is *busy*: that call is answered in-process and
  counted in `d3router_redis_busy_total`, and Redis is not taken for down (it was answering the others). The wait is
  ours (a semaphore of the pool's size in front of redis-py's pool), not redis-py's `BlockingConnectionPool`, whose
  wait runs out with the same `ConnectionError` a refused connection raises, inside the same timeout as the command.
- Only a real failure opens the breaker: a refused or reset connection, a server error (OOM, READONLY, LOADING), a
  command without an answer within `redis_timeout_s` (redis-py's own retries are off: the breaker is the retry).
  Open, Redis is left alone for `RETRY_S` (no request waits on a dead server); then one call probes it, the others
  still answered in-process, and the probe's answer closes the breaker.
- One log line when the breaker opens and one when it closes, never one per request: calls that were under way when
  it opened neither close it by succeeding nor log by failing. `d3router_redis_down` is 1 while it is open.

Lua scripts (rate limits, budgets: a round trip on each such request's path) go through one pipelined connection of
their own instead (router/_sessions/pipe.py: half of redis-py's CPU a call), which waits for no pool, so a script
is never busy; the breaker, the timeout and the fallback are the same.

Why 32 connections: the limit on one process's Redis calls is its own event loop, not Redis. redis-py costs ~150 us
of the loop per call (200 concurrent calls to a local redis-server take 30 ms on a 2-core machine), so a command's
50 ms timeout also runs while the loop works through every other call in flight: with 128 or 256 in flight, cold
rounds of 200 calls timed out 18 to 182 of them (taken for Redis down); with 32, none, in 24 rounds of 200 and 1,000
(the extra calls wait, and a wait over the timeout is busy). 32 connections still outrun the loop at a 1 ms round
trip (32,000 calls/s against its ~6,500). Connections skip redis-py's `CLIENT SETINFO` (two commands more per new
connection, at a burst's start). Measured with `python -m benchmarks.redis_pool` (its docstring has the command).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import MaxConnectionsError, RedisError

from d3backend import SharedCache
from policies import ServerSettings
from router._observe.metrics import Counts, Metrics
from router._sessions.pipe import Pipe

logger = logging.getLogger(__name__)

_FAILURES = (RedisError, OSError, TimeoutError)  # redis-py's errors, sockets, and our own timeout
RETRY_S = 1.0  # after a Redis failure, how long the in-process store answers alone before Redis is tried again
MAX_CONNECTIONS = 32  # the pool's default size (`server.redis_max_connections`; the module's docstring says why)

Outcome = Literal["answered", "busy", "down"]  # Redis answered; no free connection in time; Redis failed or left alone


class Store(Protocol):
    """Where sessions live: string keys (hashed) to short string values (upstream names), each with a TTL."""

    async def get(self, key: str, ttl_s: float | None = None) -> str | None:
        """The value of `key`, or None; with `ttl_s`, its TTL starts again (a session lives from its last turn)."""
        ...

    async def set(self, key: str, value: str, ttl_s: float) -> None: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """The in-process store: bounded (the least recently used go first) and with a TTL per entry. An expired entry
    is dropped when it is next read, or in its turn as the least recently used."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        # Each entry is (value, its deadline on the monotonic clock), least recently used first: an OrderedDict sets
        # and reads one in 0.3 us where cachetools' TLRUCache (a heap of deadlines) took 3.2 us (timeit).
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    async def get(self, key: str, ttl_s: float | None = None) -> str | None:
        return self.get_now(key, ttl_s)

    def get_now(self, key: str, ttl_s: float | None = None) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            del self._entries[key]
            return None
        if ttl_s is None:
            self._entries.move_to_end(key)
        else:
            self.set_now(key, entry[0], ttl_s)
        return entry[0]

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        self.set_now(key, value, ttl_s)

    def set_now(self, key: str, value: str, ttl_s: float) -> None:
        entries = self._entries
        entries[key] = (value, time.monotonic() + ttl_s)
        entries.move_to_end(key)
        if len(entries) > self.max_entries:
            entries.popitem(last=False)

    def ttl(self, key: str) -> float:
        """The seconds `key` has left (0 when it is gone)."""
        entry = self._entries.get(key)
        return 0.0 if entry is None else max(0.0, entry[1] - time.monotonic())

    def __len__(self) -> int:
        return len(self._entries)

    async def aclose(self) -> None:
        self._entries.clear()


class RedisStore:
    """Redis (the `redis` package's asyncio client, one connection pool), written through to a `MemoryStore` that
    answers while Redis cannot. A value Redis lost (a restart) but this process still holds is written back.

        store = RedisStore("redis://redis:6379/0", timeout_s=0.05, metrics=metrics, max_connections=32)
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        metrics: Metrics,
        max_entries: int = 100_000,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.local = MemoryStore(max_entries)
        self._redis = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, max_connections=max_connections,
            retry=Retry(NoBackoff(), 0), decode_responses=True, driver_info=None,
        )  # fmt: skip
        self._pipe = Pipe(url, timeout_s=timeout_s)  # the scripts' own connection (router/_sessions/pipe.py)
        self._slots = asyncio.Semaphore(max_connections)  # held for a call's command: the pool's wait (see above)
        # The breaker: open (`_down`) from a failure until a probe after `_down_until` answers. `_epoch` counts its
        # changes, so that a call under way across one does not act on a state it did not see.
        self._down = False
        self._down_until = 0.0
        self._probing = False
        self._epoch = 0
        self.errors: Counts[str] = metrics.counter(
            "d3router_redis_errors", "Redis calls that failed or timed out, by operation.", ("op",)
        )
        self.fallbacks: Counts[str] = metrics.counter(
            "d3router_redis_fallbacks",
            "Store calls answered by the in-process store because Redis failed or was left alone after a failure, "
            "by operation.",
            ("op",),
        )
        self.busy: Counts[str] = metrics.counter(
            "d3router_redis_busy",
            "Store calls that found no free Redis connection within redis_timeout_s, answered by the in-process "
            "store (Redis is not taken for down), by operation.",
            ("op",),
        )
        self._down_gauge = metrics.gauge(
            "d3router_redis_down", "1 while Redis is taken for down (the store answers in-process), else 0."
        )

    async def get(self, key: str, ttl_s: float | None = None) -> str | None:
        # GETEX: the read and the TTL's restart in one round trip (Redis 6.2+).
        outcome, value = await self._call(
            "get", lambda: self._redis.get(key) if ttl_s is None else self._redis.getex(key, px=_ms(ttl_s))
        )
        if outcome != "answered":
            return self.local.get_now(key, ttl_s)
        if isinstance(value, str):
            if ttl_s is not None:
                self.local.set_now(key, value, ttl_s)  # what this process would answer with, should Redis go away
            return value
        kept = self.local.get_now(key)
        if kept is not None:  # Redis lost it (a restart without persistence) while this process kept it
            await self._put("set", key, kept, self.local.ttl(key))
        return kept

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        self.local.set_now(key, value, ttl_s)
        await self._put("set", key, value, ttl_s)

    async def fetch(self, key: str) -> str | None:
        """Redis's value alone (no in-process copy: the decision cache keeps its own), None when busy or down."""
        return (await self.lookup(key))[1]

    async def lookup(self, key: str) -> tuple[Outcome, str | None]:
        """`fetch`, with whether Redis answered, was busy or is down."""
        outcome, value = await self._call("answers_get", lambda: self._redis.get(key))
        return outcome, value if isinstance(value, str) else None

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        """Write to Redis alone (see `fetch`)."""
        await self._put("answers_set", key, value, ttl_s)

    async def _put(self, op: str, key: str, value: str, ttl_s: float) -> None:
        await self._call(op, lambda: self._redis.set(key, value, px=_ms(ttl_s)))

    async def run(self, op: str, script: str, keys: list[str], args: list[str]) -> tuple[Outcome, Any]:
        """Run a Lua `script` in one round trip through `_call`: ("busy" or "down", None) when Redis cannot answer.
        Scripts go through one pipelined connection (router/_sessions/pipe.py says why), which waits for no pool
        and bounds its own time: never "busy"."""
        return await self._call(op, lambda: self._pipe.script(script, keys, args), pooled=False)

    async def _call(self, op: str, call: Callable[[], Awaitable[Any]], *, pooled: bool = True) -> tuple[Outcome, Any]:
        """("answered", Redis's answer to `call()`), ("busy", None) when no connection was free within `timeout_s`,
        or ("down", None) when Redis is left alone after a failure or fails now: counted and logged, never raised (a
        store never fails a request). `pooled=False`: `call` takes no connection of the pool and bounds its own
        time."""
        epoch, probe = self._epoch, self._admit()
        if probe is None:
            self.fallbacks[op] += 1
            return "down", None
        if pooled and not await self._wait_for_slot():
            self._busy(op, probe)
            return "busy", None
        try:
            answer = await (self._pooled(call) if pooled else call())
        except MaxConnectionsError:  # a connection the pool lost track of (a call cut mid-release): still not down
            self._busy(op, probe)
            return "busy", None
        except _FAILURES as exc:
            self._failed(op, exc, epoch, probe)
            return "down", None
        finally:
            if pooled:
                self._slots.release()
        if probe:
            self._up()
        return "answered", answer

    async def _pooled(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async with asyncio.timeout(self.timeout_s):
            return await call()

    def _admit(self) -> bool | None:
        """None when Redis is left alone now; else whether this call is the probe of an open breaker."""
        if not self._down:
            return False
        if self._probing or time.monotonic() < self._down_until:
            return None
        self._probing = True
        return True

    async def _wait_for_slot(self) -> bool:
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
            return True
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            return False
        return True

    def usable(self) -> bool:
        """Whether Redis is tried now: not within `RETRY_S` of its last failure."""
        return not self._down or time.monotonic() >= self._down_until

    def _busy(self, op: str, probe: bool) -> None:
        self.busy[op] += 1
        if probe:  # no answer either way: the next call probes instead
            self._probing = False

    def _failed(self, op: str, exc: BaseException, epoch: int, probe: bool) -> None:
        self.errors[op] += 1
        self.fallbacks[op] += 1
        if probe:
            self._probing = False
            self._down_until = time.monotonic() + RETRY_S
        elif not self._down and epoch == self._epoch:  # not a call from before the breaker's last change
            self._down, self._down_until, self._epoch = True, time.monotonic() + RETRY_S, self._epoch + 1
            self._down_gauge.set(1)
            logger.warning("redis %s failed (%s); sessions and decisions are kept in-process until it answers again",
                           _safe(self.url), type(exc).__name__)  # fmt: skip

    def _up(self) -> None:
        self._down, self._probing, self._epoch = False, False, self._epoch + 1
        self._down_gauge.set(0)
        logger.warning("redis %s answers again; sessions and decisions are shared again", _safe(self.url))

    async def aclose(self) -> None:
        await self._pipe.aclose()
        try:
            async with asyncio.timeout(1.0):
                await self._redis.aclose()
        except _FAILURES as exc:  # closing a pool to a dead server must not fail the shutdown
            logger.debug("redis close: %s", exc)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _safe(url: str) -> str:
    """The URL without its password, for logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


class SharedAnswers:
    """The second-level decision cache in Redis (issue 12.4): a decision's answers under `d3:answers:<digest>`,
    shared by every replica, so a decision one replica paid the engine for is a cache hit on the others. The
    content digest is hashed again with the sessions' salt (the same on every replica), so that whoever reads Redis
    cannot test a guessed prompt against the keys."""

    PREFIX = "d3:answers:"

    def __init__(self, store: RedisStore, metrics: Metrics, salt: bytes) -> None:
        self.store = store
        self._salt = hashlib.blake2b(salt, digest_size=32).digest()  # any length in, BLAKE2's key size out
        self.lookups: Counts[str] = metrics.counter(
            "d3router_shared_cache",
            "Decisions looked up in the shared (Redis) cache after an in-process miss: hit, miss, busy or down.",
            ("result",),
        )

    async def get(self, key: str) -> str | None:
        outcome, value = await self.store.lookup(self._key(key))
        self.lookups["hit" if value is not None else ("miss" if outcome == "answered" else outcome)] += 1
        return value

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        await self.store.put(self._key(key), value, ttl_s)

    def _key(self, digest: str) -> str:
        return self.PREFIX + hashlib.blake2b(digest.encode(), key=self._salt, digest_size=16).hexdigest()


def shared_answers(store: Store, metrics: Metrics, salt: bytes) -> SharedCache | None:
    """The shared decision cache for this store: Redis's, or None for the in-process store (its cache is local)."""
    return SharedAnswers(store, metrics, salt) if isinstance(store, RedisStore) else None


def build_store(server: ServerSettings, metrics: Metrics) -> MemoryStore | RedisStore:
    """The store for this process: Redis when `server.redis` is set, else in-process."""
    max_entries = server.sessions.max_entries
    if server.redis is None:
        return MemoryStore(max_entries)
    return RedisStore(
        server.redis, timeout_s=server.redis_timeout_s, metrics=metrics, max_entries=max_entries,
        max_connections=server.redis_max_connections,
    )  # fmt: skip
