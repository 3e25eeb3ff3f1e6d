"""`CachedEngine`: a TTL + LRU cache in front of any engine, with single-flight.

    engine = CachedEngine(RemoteEngine(["http://d3:8000"]), max_entries=10_000, ttl_s=600)

Equal decisions (same model, state, questions and media) within the TTL are answered from memory; equal
decisions *in flight* share one engine call, also with `max_entries=0` (no cache: single-flight alone). The key is
a BLAKE2 digest of the decision's content (never of an object's identity), so the cache holds no request text.
With `shared=` (a `SharedCache`, such as d3router's Redis), a miss asks the shared cache before the engine, and an
engine's answer is written there in the background for the other processes; the shared cache is never waited on
longer than its own timeout and never fails a call.
Errors are never cached: a failed or timed-out call releases every caller waiting on it with its error, and the
next request for that key starts a new call. A caller that goes away (a client disconnect cancels it) does not
cancel the shared call, which still fills the cache for the others. `timeout_s` bounds the shared call for an
inner engine without a timeout of its own (`RemoteEngine` and `EmbeddedEngine` have theirs).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cachetools import TTLCache

from d3backend._errors import EngineTimeout
from d3backend._protocol import Closing, DecisionEngine
from d3backend._shared import SharedCache, decode_decided, encode_decided
from d3backend._types import Decided, Question
from d3backend._wire import JSONValue

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    shared: int  # calls that joined an identical one in flight
    size: int
    shared_hits: int = 0  # misses answered by the shared cache (not the engine)


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
        shared: SharedCache | None = None,
    ) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be 0 (single-flight, no cache) or more; found {max_entries!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds or None; found {timeout_s!r}")
        self._timeout_s = timeout_s
        self.engine = engine
        self._owns_engine = owns_engine
        self._keeps = max_entries > 0
        self._cache: TTLCache[bytes, Decided] = TTLCache(maxsize=max(max_entries, 1), ttl=ttl_s, timer=timer)
        self._ttl_s = ttl_s
        self.shared = shared
        self._writes: set[asyncio.Task[None]] = set()  # shared-cache writes under way (awaited on close)
        self._in_flight: dict[bytes, asyncio.Task[Decided]] = {}
        self._hits = self._misses = self._shared = self._shared_hits = 0
        # The questions' part of the key, per mapping: policies ask the same mapping on every request. An entry is
        # used only while the mapping holds equal items (issue 19.11): identical ones, the common case, compare
        # at the cost of a tuple.
        self._parts: dict[int, tuple[Mapping[str, Question], tuple[tuple[str, Question], ...], bytes]] = {}

    @property
    def model(self) -> str | None:
        return getattr(self.engine, "model", None)

    @property
    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._shared, len(self._cache), self._shared_hits)

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        start = time.perf_counter()
        key = _key(self.model, state, self._questions_part(questions), images, videos)
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

    def _questions_part(self, questions: Mapping[str, Question]) -> bytes:
        items = tuple(questions.items())
        entry = self._parts.get(id(questions))
        if entry is not None and entry[0] is questions and entry[1] == items:
            return entry[2]
        if len(self._parts) >= 1024:
            self._parts.clear()
        part = _questions_part(items)
        self._parts[id(questions)] = (questions, items, part)
        return part

    async def _fill(
        self,
        key: bytes,
        state: JSONValue,
        questions: Mapping[str, Question],
        images: Sequence[str],
        videos: Sequence[str],
    ) -> Decided:
        try:
            if self.shared is not None:
                found = await self._shared_get(key, questions)
                if found is not None:
                    self._shared_hits += 1
                    if self._keeps:
                        self._cache[key] = found
                    return found._replace(cached=True)
            if self._timeout_s is None:
                decided = await self.engine.decide(state, questions, images=images, videos=videos)
            else:
                try:
                    async with asyncio.timeout(self._timeout_s):
                        decided = await self.engine.decide(state, questions, images=images, videos=videos)
                except TimeoutError:
                    raise EngineTimeout(f"the decision engine did not answer within {self._timeout_s:g} s") from None
            if self._keeps:
                self._cache[key] = decided
            if self.shared is not None:  # in the background: the caller has its answer now
                write = asyncio.ensure_future(self.shared.set(key.hex(), encode_decided(decided), self._ttl_s))
                self._writes.add(write)
                write.add_done_callback(self._written)
            return decided
        finally:
            # Whatever the outcome, the key is free for the next request: a failed call is never waited on again.
            del self._in_flight[key]

    async def _shared_get(self, key: bytes, questions: Mapping[str, Question]) -> Decided | None:
        if self.shared is None:
            return None
        try:
            text = await self.shared.get(key.hex())
        except Exception:  # a shared cache that breaks its promise to answer None still fails no call
            logger.exception("the shared decision cache failed; asking the engine")
            return None
        return None if text is None else decode_decided(text, questions)

    def _written(self, write: asyncio.Task[None]) -> None:
        self._writes.discard(write)
        if not write.cancelled() and write.exception() is not None:
            logger.error("the shared decision cache failed a write: %r", write.exception())

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
        await asyncio.gather(*self._writes, return_exceptions=True)  # each bounded by the shared cache's timeout
        self._cache.clear()
        if self._owns_engine:
            await self.engine.aclose()


def _retrieve(task: asyncio.Task[Decided]) -> None:
    """Mark a shared call's error as seen: when every caller left before it failed, asyncio would otherwise log
    "Task exception was never retrieved" for an error the next request simply meets again."""
    if not task.cancelled():
        task.exception()


def cache_key(
    model: str | None,
    state: JSONValue,
    questions: Mapping[str, Question],
    images: Sequence[str] = (),
    videos: Sequence[str] = (),
) -> bytes:
    """A stable digest of everything that decides the answers.

    Every part is length-prefixed (or of fixed length), so the encoding is injective: no URL, model name or state
    can contain a separator that makes two different decisions look alike (issue 19.13). The questions enter by
    their content digest, computed once when each question is built (issue 19.11), and in their order."""
    return _key(model, state, _questions_part(tuple(questions.items())), images, videos)


def _questions_part(items: Sequence[tuple[str, Question]]) -> bytes:
    parts = [b"q%d:" % len(items)]
    for qid, question in items:
        name = qid.encode("utf-8", "surrogatepass")
        parts += (b"%d:" % len(name), name, question.digest)  # the digest is 16 bytes
    return b"".join(parts)


def _key(
    model: str | None, state: JSONValue, questions_part: bytes, images: Sequence[str], videos: Sequence[str]
) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    update = digest.update
    if model is None:
        update(b"-")
    else:
        name = model.encode("utf-8", "surrogatepass")
        update(b"m%d:%s" % (len(name), name))
    if isinstance(state, str):
        data = state.encode("utf-8", "surrogatepass")
        update(b"s%d:" % len(data))
    else:
        data = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8", "surrogatepass")
        update(b"j%d:" % len(data))
    update(data)
    update(questions_part)
    if not images and not videos:  # the common case, without formatting
        update(b"i0:v0:")
        return digest.digest()
    for tag, media in ((b"i", images), (b"v", videos)):
        update(b"%s%d:" % (tag, len(media)))
        for item in media:
            data = item.encode("utf-8", "surrogatepass")
            update(b"%d:" % len(data))
            update(data)
    return digest.digest()
