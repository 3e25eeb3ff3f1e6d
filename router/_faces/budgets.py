"""Token budgets and token rates per key and per group (issue 29.4), in process or shared through Redis.

    budgets = build_budgets(store, clock)
    used = await budgets.check(caller)          # the share used of its most used budget (`budget.used`), or 429
    await budgets.spend(caller, tokens, cost)   # once the answer's usage is known

Each limit is a counter per fixed window: a budget's calendar period in UTC (`day`, `month`), a token rate's
`window_s`. A request is refused (429 in its API's shape, naming the limit and when it resets, with Retry-After)
while a counter has reached its limit; an answer's tokens (and cost) are added once it ended, so that the request
that crosses a limit is served whole and the next one is refused. With `server.redis`, the counters are read in one
round trip (MGET) and added to in one (a Lua script: INCRBYFLOAT and an expiry at the window's end); Redis slow or
down, each replica counts on its own from then on (one log line, the store's), and no request fails for it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from router._errors import RateLimited
from router._faces.auth import Caller
from router._sessions.store import MemoryStore, RedisStore, Store

Clock = Callable[[], float]
MAX_COUNTERS = 100_000  # counters kept in process (least recently used dropped first)

# KEYS: the counters; ARGV: per counter the amount to add and its expiry (unix seconds). One round trip.
_SPEND = """
for i, key in ipairs(KEYS) do
  redis.call('INCRBYFLOAT', key, ARGV[2 * i - 1])
  redis.call('EXPIREAT', key, ARGV[2 * i])
end
return 0
"""
_READ = "return redis.call('MGET', unpack(KEYS))"


@dataclass(frozen=True, slots=True)
class Limit:
    """One counter of a caller: what it counts (`tokens` or `cost`), its most, its window now."""

    name: str  # e.g. "key 'alice''s daily token budget"
    key: str  # the counter's key in this window
    counts: str  # tokens | cost
    most: float
    resets_at: float  # unix seconds
    budget: bool  # a budget (read as `budget.used`), or a token rate


def _period(period: str, now: float) -> tuple[str, float]:
    """The calendar window `now` is in (its label) and when it ends, in UTC."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day.strftime("%Y%m%d"), day.timestamp() + 86_400
    first = day.replace(day=1)
    following = (
        first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
    )
    return first.strftime("%Y%m"), following.timestamp()


def limits(caller: Caller, now: float) -> list[Limit]:
    """The counters that apply to `caller` now: its key's and its group's budgets and token rates."""
    found: list[Limit] = []
    for scope, who, budget, rate in (
        ("key", caller.name, caller.budget, caller.token_rate),
        ("group", caller.group, caller.group_budget, caller.group_token_rate),
    ):
        if who is None:
            continue
        if budget is not None:
            label, ends = _period(budget.period, now)
            every = "daily" if budget.period == "day" else "monthly"
            for counts, most in (("tokens", budget.tokens), ("cost", budget.cost)):
                if most is not None:
                    found.append(Limit(f"{scope} {who!r}'s {every} {'token' if counts == 'tokens' else 'cost'} budget",
                                       f"d3:budget:{scope}:{who}:{counts}:{budget.period}:{label}", counts, most,
                                       ends, True))  # fmt: skip
        if rate is not None:
            window = math.floor(now / rate.window_s)
            found.append(Limit(f"{scope} {who!r}'s token rate ({rate.tokens} per {rate.window_s:g} s)",
                               f"d3:tokens:{scope}:{who}:{rate.window_s:g}:{window}", "tokens", rate.tokens,
                               (window + 1) * rate.window_s, False))  # fmt: skip
    return found


class Budgets:
    """The counters of every caller, in this process; `RedisBudgets` shares them."""

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock
        self._used: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (used, expires at)

    async def read(self, found: list[Limit]) -> list[float]:
        return self.local(found)

    def local(self, found: list[Limit]) -> list[float]:
        now = self.clock()
        out = []
        for limit in found:
            used, ends = self._used.get(limit.key, (0.0, 0.0))
            out.append(used if ends > now else 0.0)
        return out

    async def check(self, caller: Caller) -> float:
        """The share used of `caller`'s most used budget (0 without one); `RateLimited` (429, Retry-After) when one
        of its budgets or token rates is used up."""
        now = self.clock()
        found = limits(caller, now)
        if not found:
            return 0.0
        used = await self.read(found)
        share = 0.0
        for limit, value in zip(found, used, strict=True):
            if value >= limit.most:
                resets = datetime.fromtimestamp(limit.resets_at, UTC).isoformat(timespec="seconds")
                message = (f"the {limit.name} is used up ({value:g} of {limit.most:g} {limit.counts}); it resets at "
                           f"{resets.replace('+00:00', 'Z')}")  # fmt: skip
                raise RateLimited(message, max(1, math.ceil(limit.resets_at - now)))
            if limit.budget:
                share = max(share, value / limit.most)
        return share

    async def spend(self, caller: Caller, tokens: int, cost: float | None) -> None:
        """Add an answer's tokens (and cost) to `caller`'s counters."""
        found = limits(caller, self.clock())
        amounts = [(limit, float(tokens) if limit.counts == "tokens" else (cost or 0.0)) for limit in found]
        amounts = [(limit, amount) for limit, amount in amounts if amount > 0]
        if amounts:
            await self.add(amounts)

    async def add(self, amounts: list[tuple[Limit, float]]) -> None:
        self.local_add(amounts)

    def local_add(self, amounts: list[tuple[Limit, float]]) -> None:
        now = self.clock()
        for limit, amount in amounts:
            used, ends = self._used.get(limit.key, (0.0, 0.0))
            self._used[limit.key] = ((used if ends > now else 0.0) + amount, limit.resets_at)
            self._used.move_to_end(limit.key)
        while len(self._used) > MAX_COUNTERS:
            self._used.popitem(last=False)


class RedisBudgets(Budgets):
    """The counters kept in Redis, shared by the replicas; this process's own while Redis cannot answer."""

    def __init__(self, store: RedisStore, clock: Clock = time.time) -> None:
        super().__init__(clock)  # wall-clock time: the replicas share the windows
        self.store = store

    async def read(self, found: list[Limit]) -> list[float]:
        outcome, values = await self.store.run("budget_read", _READ, [limit.key for limit in found], [])
        if outcome != "answered" or not isinstance(values, list):
            return self.local(found)
        return [float(value) if value is not None else 0.0 for value in values]

    async def add(self, amounts: list[tuple[Limit, float]]) -> None:
        # The answer was delivered, so its tokens count even if the client leaves now: uvicorn reports a disconnect as
        # soon as a response has ended, which cancels the request's task (`cancel_on_disconnect`). The write (and its
        # fallback) runs to its end in a task of its own, bounded by the store's timeout.
        await asyncio.shield(self._add(amounts))

    async def _add(self, amounts: list[tuple[Limit, float]]) -> None:
        args: list[str] = []
        for limit, amount in amounts:
            args += [repr(amount), str(math.ceil(limit.resets_at) + 60)]  # kept a minute past its window
        outcome, _ = await self.store.run("budget_spend", _SPEND, [limit.key for limit, _ in amounts], args)
        if outcome != "answered":
            self.local_add(amounts)


def build_budgets(store: Store | MemoryStore, clock: Clock = time.time) -> Budgets:
    return RedisBudgets(store, clock) if isinstance(store, RedisStore) else Budgets(clock)
