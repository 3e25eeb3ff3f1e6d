"""Request rate limits per key and per group (issue 25.5): GCRA, in process or shared through Redis.

    limiter = build_limiter(store, clock)
    wait_s = await limiter.hit(caller)      # 0: allowed (and counted); else the seconds until one is
    await limiter.check(caller)             # or RateLimited (429, Retry-After)
    pending = await limiter.begin(caller, size)   # the same, its Redis round trip read later (`Pending`)

GCRA (the generic cell rate algorithm) keeps one number per limit, the time the next request is due: a request is
allowed when that time is at most `interval * (burst - 1)` ahead of now, and pushes it one interval on. A request
counts against its key's limit and its group's only when both allow it. With `server.redis`, both limits are read,
checked and written by one Lua script, in one round trip; Redis slow or down, each replica limits on its own (one
log line, the store's), and no request fails for it.

The Redis keys carry a hash tag (the part in braces, which alone picks a Redis Cluster slot), so that what one script
reads and writes lives in one slot, as Redis Cluster requires of a script's keys (else CROSSSLOT):

    d3:rate:{key:K}              a key's limit, the key in no group
    d3:rate:{group:G}            a group's limit
    d3:rate:{group:G}:key:K      the limit of a key in group G: in its group's slot, checked with it in one script

Key names cannot hold a brace (policies/_access.py); a group's name may, and then both of its keys still share the tag
(the tag ends at the first `}`, at the same place in both). The router's client is a plain Redis client: it speaks
to one Redis Cluster node that holds every slot (tests/router/test_limits.py starts one), not to a cluster of several
(those answer MOVED; see docs/security.md#rate-limits).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from policies import RateSpec
from router._errors import RateLimited
from router._faces.auth import Caller
from router._sessions.store import MemoryStore, RedisStore, Store

Clock = Callable[[], float]
MAX_LIMITS = 100_000  # limits kept in process (least recently used dropped first)
EARLY_BYTES = 64 * 1024  # a body up to this size is read while Redis answers its rate check (`RedisLimiter.begin`)

# KEYS: the limits; ARGV: now, then per limit its interval and its tolerance (seconds). Returns the wait as text
# (Lua numbers become integers on the way out): "0" allowed, and every limit pushed on.
_SCRIPT = """
local now = tonumber(ARGV[1])
local wait = 0
local due = {}
for i, key in ipairs(KEYS) do
  local interval, tolerance = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  if tat - now > tolerance then wait = math.max(wait, tat - now - tolerance) end
  due[i] = {tat + interval, math.ceil((tat + interval - now) * 1000) + 1000}
end
if wait > 0 then return tostring(wait) end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, tostring(due[i][1]), 'PX', due[i][2])
end
return '0'
"""


def _limits(caller: Caller) -> list[tuple[str, RateSpec]]:
    """The limits `caller` counts against, by their Redis keys (one hash tag for all of them: see above)."""
    limits = []
    group = None if caller.group is None else f"d3:rate:{{group:{caller.group}}}"
    if caller.rate is not None and caller.name is not None:
        key = f"d3:rate:{{key:{caller.name}}}" if group is None else f"{group}:key:{caller.name}"
        limits.append((key, caller.rate))
    if caller.group_rate is not None and group is not None:
        limits.append((group, caller.group_rate))
    return limits


class Pending:
    """A rate check under way while the request's body is read; `verdict` reads it once (RateLimited, or None)."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        self._task: asyncio.Task[None] | None = task

    async def verdict(self) -> None:
        """RateLimited when the caller is over its rate; each later call returns at once."""
        task, self._task = self._task, None
        if task is not None:
            await task

    def drop(self) -> None:
        """The request ended before its verdict was read: the check is cancelled (its count, if Redis had it, stays);
        a verdict already in is never raised (cancelling a done task marks its outcome read: asyncio logs nothing)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()


class Limiter:
    """The rate limits of every caller, in this process; `RedisLimiter` shares them."""

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock
        self._due: OrderedDict[str, float] = OrderedDict()

    async def hit(self, caller: Caller) -> float:
        """0 when `caller` may send a request now (it is counted), else the seconds until it may."""
        limits = _limits(caller)
        return self.local(limits) if limits else 0.0

    def local(self, limits: list[tuple[str, RateSpec]]) -> float:
        now = self.clock()
        wait = 0.0
        due = []
        for key, rate in limits:
            tat = max(self._due.get(key, now), now)
            tolerance = rate.interval_s * (rate.most - 1)
            if tat - now > tolerance:
                wait = max(wait, tat - now - tolerance)
            due.append((key, tat + rate.interval_s))
        if wait > 0:
            return wait
        for key, tat in due:
            self._due[key] = tat
            self._due.move_to_end(key)
        while len(self._due) > MAX_LIMITS:
            self._due.popitem(last=False)
        return 0.0

    async def check(self, caller: Caller) -> None:
        """`RateLimited` (429, Retry-After) when `caller` is over its key's or its group's rate."""
        wait = await self.hit(caller)
        if wait > 0:
            which = "its group's" if caller.group_rate is not None else "its"
            raise RateLimited(f"the key {caller.name!r} is over {which} request rate; retry after {wait:.1f} s",
                              max(1, math.ceil(wait)))  # fmt: skip

    async def begin(self, caller: Caller, size: int) -> Pending | None:
        """Check `caller`'s rate as `check` does, here at once: None, or RateLimited. `RedisLimiter` may leave it
        under way instead."""
        await self.check(caller)
        return None


class RedisLimiter(Limiter):
    """The limits kept in Redis, shared by the replicas; this process's own while Redis cannot answer."""

    def __init__(self, store: RedisStore, clock: Clock = time.time) -> None:
        super().__init__(clock)  # wall-clock time: the replicas share it, as they share the limits
        self.store = store

    async def hit(self, caller: Caller) -> float:
        limits = _limits(caller)
        if not limits:
            return 0.0
        args = [repr(self.clock())]
        for _, rate in limits:
            args += [repr(rate.interval_s), repr(rate.interval_s * (rate.most - 1))]
        outcome, wait = await self.store.run("rate", _SCRIPT, [key for key, _ in limits], args)
        if outcome != "answered":
            return self.local(limits)
        return float(wait)

    async def begin(self, caller: Caller, size: int) -> Pending | None:
        """The check's script sent; its answer read later (`Pending.verdict`), so that the round trip runs while the
        request's body is read and parsed (`size`, its content-length: a body over EARLY_BYTES, or of unknown size,
        waits for the answer first, so that a caller over its rate cannot make the router read and parse big bodies).
        The proxy reads the verdict before the request reaches a decision, an engine or an upstream."""
        if not _limits(caller) or not 0 < size <= EARLY_BYTES:
            await self.check(caller)
            return None
        pending = Pending(asyncio.create_task(self.check(caller)))
        await asyncio.sleep(0)  # the task writes its command now, before the body is read
        return pending


def build_limiter(store: Store | MemoryStore, clock: Clock = time.time) -> Limiter:
    return RedisLimiter(store, clock) if isinstance(store, RedisStore) else Limiter(clock)
