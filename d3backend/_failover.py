"""`FailoverEngine`: engines of any kind tried in order, the first that answers deciding (issue 28.2).

    pool = FailoverEngine([("d3", RemoteEngine(["http://d3-a:8000"])), ("luna", DecisionsEngine(url, model=m))])
    async with CachedEngine(pool) as engine:
        decided = await engine.decide("Fix my SQL query", questions)
        decided.engine  # "d3", or "luna" when d3 could not answer

Each call goes to the first engine; on any `EngineError` (its own timeout included) the next is asked, and so on;
when every one fails, the last error is raised (an `EngineError`, so the policy's `on_engine_error` applies).
`timeout_s`, per engine, bounds each try whatever the engine does with its own deadline: a caller's overall one
(the router's `server.decision_timeout_s`) then leaves time for the next engine.

An engine that failed on its own account (unreachable, a 5xx, a timeout, a 429: `EngineUnavailable`,
`EngineTimeout`, `EngineRateLimited`) is set aside for `set_aside_s`: calls skip it, so a down first engine does not
cost every request its timeout. A request the engine refused (another 4xx) or answered badly fails over too, but
sets nothing aside: the next request may be fine. When every engine is set aside, all are tried in order anyway:
there is nothing better to do. The answer's `Decided.engine` names the engine that answered. Two models'
probabilities differ: calibrate a policy per engine (docs/engines.md#pools-across-kinds).

`POOL_MODEL`, a context variable, narrows the calls in its context to the engines serving that model (`d3router`'s
`POST /v1/decisions` naming one engine's model, not the pool's): only they are asked, in order, set aside or not,
and `model` is that model, so the cache in front keeps their answers apart from the pool's.

    token = POOL_MODEL.set("luna-test")
    try:
        decided = await CachedEngine(pool).decide(state, questions)   # the `luna-test` engine's answer, or its error
    finally:
        POOL_MODEL.reset(token)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from d3backend._errors import EngineError, EngineRateLimited, EngineRefused, EngineTimeout, EngineUnavailable
from d3backend._protocol import Closing, DecisionEngine
from d3backend._types import Decided, Question
from d3backend._wire import JSONValue

logger = logging.getLogger(__name__)
# The engine's own trouble, which the next request would meet too (a 429 included: retrying adds to its load).
_OWN_TROUBLE = (EngineUnavailable, EngineTimeout, EngineRateLimited)
POOL_MODEL: ContextVar[str | None] = ContextVar("d3backend_pool_model", default=None)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One engine of a `FailoverEngine` as `pool_stats()` shows it: `answers` it gave, `failures` it had,
    `set_aside_until` (on the `time.monotonic()` clock) while calls skip it, else None."""

    name: str
    answers: int
    failures: int
    set_aside_until: float | None


@dataclass(slots=True)
class _Member:
    name: str
    engine: DecisionEngine
    timeout_s: float | None
    set_aside_s: float
    until: float = 0.0  # set aside until then (the timer's clock)
    answers: int = 0
    failures: int = 0


class FailoverEngine(Closing):
    """`engines`: (name, engine) pairs in the order they are tried; `timeouts_s`, when given, one deadline (or None)
    per engine; `set_aside_s`, one or one per engine. Closes every engine on `aclose()` unless `owns_engines=False`."""

    def __init__(
        self,
        engines: Sequence[tuple[str, DecisionEngine]],
        *,
        timeouts_s: Sequence[float | None] | None = None,
        set_aside_s: float | Sequence[float] = 5.0,
        owns_engines: bool = True,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not engines:
            raise ValueError("FailoverEngine needs at least one engine")
        names = [name for name, _ in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"FailoverEngine's engines need distinct names; found {names!r}")
        timeouts = list(timeouts_s) if timeouts_s is not None else [None] * len(engines)
        if len(timeouts) != len(engines):
            raise ValueError(f"FailoverEngine needs one timeout per engine; found {len(timeouts)} for {len(engines)}")
        asides = [float(set_aside_s)] * len(engines) if isinstance(set_aside_s, int | float) else list(set_aside_s)
        if len(asides) != len(engines) or any(not aside >= 0 for aside in asides):
            raise ValueError(f"set_aside_s must be 0 or more seconds, one or one per engine; found {set_aside_s!r}")
        self._members = tuple(
            _Member(name, engine, timeout, aside)
            for (name, engine), timeout, aside in zip(engines, timeouts, asides, strict=True)
        )
        self._owns_engines = owns_engines
        self._timer = timer

    @property
    def model(self) -> str:
        """Every engine's model, in order (`pool(a,b)`): the cache in front keys by it, so a pool's answers are never
        read as those of one of its engines alone. Within `POOL_MODEL` naming one of them, that model."""
        only = POOL_MODEL.get()
        models = self.models
        if only is not None and only in models:
            return only
        return f"pool({','.join(models)})"

    @property
    def models(self) -> tuple[str, ...]:
        """Each engine's model (its name while the model is not known yet), in order."""
        return tuple(_model(member) for member in self._members)

    @property
    def engines(self) -> tuple[tuple[str, DecisionEngine], ...]:
        return tuple((member.name, member.engine) for member in self._members)

    def pool_stats(self) -> tuple[PoolStats, ...]:
        now = self._timer()
        return tuple(
            PoolStats(m.name, m.answers, m.failures, m.until if m.until > now else None) for m in self._members
        )

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        """Ask the first engine not set aside; on an `EngineError`, the next; raise the last error if none answers."""
        now = self._timer()
        only = POOL_MODEL.get()
        narrowed = [member for member in self._members if _model(member) == only] if only is not None else []
        if narrowed:  # the client named this model: its engines alone, set aside or not
            order = narrowed
        else:
            order = [member for member in self._members if member.until <= now] or list(self._members)
        error: EngineError | None = None
        for member in order:
            try:
                if member.timeout_s is None:
                    decided = await member.engine.decide(state, questions, images=images, videos=videos)
                else:
                    async with asyncio.timeout(member.timeout_s):
                        decided = await member.engine.decide(state, questions, images=images, videos=videos)
            except TimeoutError:
                error = EngineTimeout(f"the engine {member.name!r} did not answer within {member.timeout_s:g} s")
                self._failed(member, error)
                continue
            except EngineError as exc:
                if isinstance(exc, EngineRefused):  # an answer, of refusals: which engine gave it is told as for one
                    exc.engine = member.name
                error = exc
                self._failed(member, exc)
                continue
            member.answers += 1
            member.until = 0.0
            return decided._replace(engine=member.name)
        if error is None:  # unreachable: `order` is never empty
            raise EngineUnavailable("no engine in the pool could be asked")
        raise error

    async def probe(self) -> Decided | None:
        """The first engine's probe that answers (the pool is ready when one engine is); None when none has one."""
        error: EngineError | None = None
        for member in self._members:
            probe = getattr(member.engine, "probe", None)
            if probe is None:
                continue
            try:
                decided: Decided = await probe()
            except EngineError as exc:
                error = exc
                continue
            return decided._replace(engine=member.name)
        if error is not None:
            raise error
        return None

    async def probe_each(self) -> tuple[tuple[str, EngineError | None], ...]:
        """Every engine's probe at once, by name: None where it answered (or has none), else its error. `probe` is
        ready when one engine answers, so an engine after it that cannot (a wrong key, URL or model) shows only here,
        not in an outage (d3router runs it once at startup)."""

        async def one(member: _Member) -> EngineError | None:
            probe = getattr(member.engine, "probe", None)
            if probe is None:
                return None
            try:
                await probe()
            except EngineError as exc:
                return exc
            return None

        errors = await asyncio.gather(*(one(member) for member in self._members))
        return tuple((member.name, error) for member, error in zip(self._members, errors, strict=True))

    async def aclose(self) -> None:
        if self._owns_engines:
            for member in self._members:
                await member.engine.aclose()

    def _failed(self, member: _Member, error: EngineError) -> None:
        member.failures += 1
        if isinstance(error, _OWN_TROUBLE) and member.set_aside_s > 0:
            member.until = self._timer() + member.set_aside_s
            logger.warning(
                "the engine %r failed (%s); the next engines answer for %g s", member.name, error, member.set_aside_s
            )
        else:
            logger.info("the engine %r could not decide (%s); asking the next", member.name, error)


def _model(member: _Member) -> str:
    return str(getattr(member.engine, "model", None) or member.name)
