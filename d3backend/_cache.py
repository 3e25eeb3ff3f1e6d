"""`CachedEngine`: a TTL + LRU cache in front of any engine, with single-flight.

    engine = CachedEngine(RemoteEngine(["http://d3:8000"]), max_entries=10_000, ttl_s=600)

Equal decisions (same model, state, questions and media) within the TTL are answered from memory; equal
decisions *in flight* share one engine call. The key is a BLAKE2 digest, so the cache holds no request text.
Errors are never cached: a failed or timed-out call releases every caller waiting on it with its error, and the
next request for that key starts a new call. A caller that goes away (a client disconnect cancels it) does not
cancel the shared call, which still fills the cache for the others. `timeout_s` bounds the shared call for an
inner engine without a timeout of its own (`RemoteEngine` and `EmbeddedEngine` have theirs).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cachetools import TTLCache

from d3backend._errors import EngineTimeout
from d3backend._protocol import Closing, DecisionEngine
from d3backend._types import Decided, Question
from d3backend._wire import JSONValue, json_bytes


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    shared: int  # calls that joined an identical one in flight
    size: int


class CachedEngine(Closing):
    """Wraps `engine`; closes it on `aclose()` unless `owns_engine=False`."""

    def __init__(
        self,
        engine: DecisionEngine,
        *,
        max_entries: int = 10_000,
        ttl_s: float = 600.0,
        owns_engine: bool = True,
        timer: Callable[[], float] = time.monotonic,
        timeout_s: float | None = None,
    ) -> None:
        if max_entries < 1:
            raise ValueError("a cache needs max_entries >= 1; use the engine itself for no cache")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds or None; found {timeout_s!r}")
        self._timeout_s = timeout_s
        self.engine = engine
        self._owns_engine = owns_engine
        self._cache: TTLCache[bytes, Decided] = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=timer)
        self._in_flight: dict[bytes, asyncio.Task[Decided]] = {}
        self._hits = self._misses = self._shared = 0
        self._blobs: dict[int, tuple[Mapping[str, Question], bytes]] = {}

    @property
    def model(self) -> str | None:
        return getattr(self.engine, "model", None)

    @property
    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._shared, len(self._cache))

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        start = time.perf_counter()
        key = cache_key(self.model, state, questions, images, videos, questions_blob=self._questions_blob(questions))
        found = self._cache.get(key)
        if found is not None:
            self._hits += 1
            return found._replace(cached=True, elapsed_ms=(time.perf_counter() - start) * 1000.0)
        task = self._in_flight.get(key)
        if task is None:
            self._misses += 1
            task = asyncio.ensure_future(self._fill(key, state, questions, images, videos))
            task.add_done_callback(_retrieve)
            self._in_flight[key] = task
        else:
            self._shared += 1
        # shield: a cancelled caller must not cancel the call others wait for.
        return await asyncio.shield(task)

    def _questions_blob(self, questions: Mapping[str, Question]) -> bytes:
        """The questions' serialized form, kept per mapping: policies ask the same mapping on every request."""
        entry = self._blobs.get(id(questions))
        if entry is not None and entry[0] is questions:
            return entry[1]
        if len(self._blobs) >= 1024:
            self._blobs.clear()
        blob = _questions_blob(questions)
        self._blobs[id(questions)] = (questions, blob)
        return blob

    async def _fill(
        self,
        key: bytes,
        state: JSONValue,
        questions: Mapping[str, Question],
        images: Sequence[str],
        videos: Sequence[str],
    ) -> Decided:
        try:
            if self._timeout_s is None:
                decided = await self.engine.decide(state, questions, images=images, videos=videos)
            else:
                try:
                    async with asyncio.timeout(self._timeout_s):
                        decided = await self.engine.decide(state, questions, images=images, videos=videos)
                except TimeoutError:
                    raise EngineTimeout(f"the decision engine did not answer within {self._timeout_s:g} s") from None
            self._cache[key] = decided
            return decided
        finally:
            # Whatever the outcome, the key is free for the next request: a failed call is never waited on again.
            del self._in_flight[key]

    async def probe(self) -> Decided | None:
        """The inner engine's probe; None when it has none (then only its first failure can say it is down)."""
        probe = getattr(self.engine, "probe", None)
        if probe is None:
            return None
        result: Decided = await probe()
        return result

    async def aclose(self) -> None:
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # ended, not left pending past the close
        self._cache.clear()
        if self._owns_engine:
            await self.engine.aclose()


def _retrieve(task: asyncio.Task[Decided]) -> None:
    """Mark a shared call's error as seen: when every caller left before it failed, asyncio would otherwise log
    "Task exception was never retrieved" for an error the next request simply meets again."""
    if not task.cancelled():
        task.exception()


def _questions_blob(questions: Mapping[str, Question]) -> bytes:
    return json_bytes([(qid, q.to_wire()) for qid, q in questions.items()])


def cache_key(
    model: str | None,
    state: JSONValue,
    questions: Mapping[str, Question],
    images: Sequence[str] = (),
    videos: Sequence[str] = (),
    *,
    questions_blob: bytes | None = None,
) -> bytes:
    """A stable digest of everything that decides the answers (`questions_blob` may carry the questions' part)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update((model or "").encode())
    digest.update(b"\0s" if isinstance(state, str) else b"\0j")
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, sort_keys=True)
    digest.update(text.encode("utf-8", "surrogatepass"))
    digest.update(b"\0q")
    digest.update(questions_blob if questions_blob is not None else _questions_blob(questions))
    for tag, media in ((b"\0i", images), (b"\0v", videos)):
        for item in media:
            digest.update(tag)
            digest.update(item.encode("utf-8", "surrogatepass"))
    return digest.digest()
