"""Shared state behind one small protocol: an in-process bounded store, or Redis shared by replicas.

    store = build_store(config.server, metrics)        # chosen once, at start
    await store.set("session:3f9a...", "large,small", ttl_s=3600)
    await store.get("session:3f9a...")                 # "large,small", or None
    engine = CachedEngine(inner, shared=shared_answers(store, metrics, salt))   # Redis: a second-level decision cache

Keys are hashed by the caller and values are upstream names or a decision's answers (probabilities, by a digest of
the decision's content): a store never holds a prompt or a body.

`RedisStore` writes through to an in-process store and answers from it whenever Redis is slow or down: each Redis
call waits at most `server.redis_timeout_s`; after a failure Redis is left alone for `RETRY_S` (no request waits on a
dead server), then the next call tries it again. Failures and fallbacks are counted in `/metrics`, and the router
logs one line when Redis goes away and one when it is back, never one per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from d3backend import SharedCache
from policies import ServerSettings
from router._observe.metrics import Counts, Metrics

logger = logging.getLogger(__name__)

_FAILURES = (RedisError, OSError, TimeoutError)  # redis-py's errors, sockets, and our own timeout
RETRY_S = 1.0  # after a Redis failure, how long the in-process store answers alone before Redis is tried again


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
    answers while Redis cannot. A value Redis lost (a restart) but this process still holds is written back."""

    def __init__(self, url: str, *, timeout_s: float, metrics: Metrics, max_entries: int = 100_000) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.local = MemoryStore(max_entries)
        self._redis = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, max_connections=64, decode_responses=True
        )
        self._scripts: dict[str, Any] = {}
        self._down_until = 0.0  # monotonic time before which Redis is not tried
        self._down = False
        self.errors: Counts[str] = metrics.counter(
            "d3router_redis_errors", "Redis calls that failed or timed out, by operation.", ("op",)
        )
        self.fallbacks: Counts[str] = metrics.counter(
            "d3router_redis_fallbacks",
            "Store calls answered by the in-process store because Redis was slow or down, by operation.",
            ("op",),
        )

    async def get(self, key: str, ttl_s: float | None = None) -> str | None:
        # GETEX: the read and the TTL's restart in one round trip (Redis 6.2+).
        answered, value = await self._call(
            "get", lambda: self._redis.get(key) if ttl_s is None else self._redis.getex(key, px=_ms(ttl_s))
        )
        if not answered:
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
        """Redis's value alone (no in-process copy: the decision cache keeps its own), None when slow or down."""
        _, value = await self._call("answers_get", lambda: self._redis.get(key))
        return value if isinstance(value, str) else None

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        """Write to Redis alone (see `fetch`)."""
        await self._put("answers_set", key, value, ttl_s)

    async def _put(self, op: str, key: str, value: str, ttl_s: float) -> None:
        await self._call(op, lambda: self._redis.set(key, value, px=_ms(ttl_s)))

    async def run(self, op: str, script: str, keys: list[str], args: list[str]) -> tuple[bool, Any]:
        """Run a Lua `script` in one round trip (EVALSHA; the script is loaded once), through `_call`: (False,
        None) when Redis is slow or down."""
        registered = self._scripts.get(script)
        if registered is None:
            registered = self._scripts[script] = self._redis.register_script(script)
        return await self._call(op, lambda: registered(keys=keys, args=args))

    async def _call(self, op: str, call: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
        """(True, Redis's answer to `call()`), or (False, None) when Redis is left alone after a failure or fails now
        or within `timeout_s`: counted and logged, never raised (a store never fails a request)."""
        if not self.usable():
            self.fallbacks[op] += 1
            return False, None
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await call()
        except _FAILURES as exc:
            self._failed(op, exc)
            return False, None
        self._ok()
        return True, answer

    def usable(self) -> bool:
        """Whether Redis is tried now: not within `RETRY_S` of its last failure."""
        return not self._down or time.monotonic() >= self._down_until

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors[op] += 1
        self.fallbacks[op] += 1
        self._down_until = time.monotonic() + RETRY_S
        if not self._down:
            self._down = True
            logger.warning("redis %s failed (%s); sessions and decisions are kept in-process until it answers again",
                           _safe(self.url), type(exc).__name__)  # fmt: skip

    def _ok(self) -> None:
        if self._down:
            self._down = False
            logger.warning("redis %s answers again; sessions and decisions are shared again", _safe(self.url))

    async def aclose(self) -> None:
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
            "Decisions looked up in the shared (Redis) cache after an in-process miss: hit, miss or down.",
            ("result",),
        )

    async def get(self, key: str) -> str | None:
        value = await self.store.fetch(self._key(key))
        self.lookups["hit" if value is not None else ("miss" if self.store.usable() else "down")] += 1
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
    return RedisStore(server.redis, timeout_s=server.redis_timeout_s, metrics=metrics, max_entries=max_entries)
