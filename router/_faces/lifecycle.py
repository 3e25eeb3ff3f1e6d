"""The proxy's lifecycle: its lifespan (start the engine, open the decision log, run the startup hooks), readiness,
closing what it opened, and reloading its configuration file.

`ProxyApp` (proxy.py beside this) is a `Lifecycle`; the request paths live there, the app's life here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TextIO

from starlette.types import Receive, Send

from d3backend import CachedEngine, DecisionEngine, EngineError, FailoverEngine
from policies import Config, ConfigError, load_config
from router._asgi.admission import Admission
from router._decision.engines import start_engine
from router._decision.service import RouterService
from router._faces.auth import Access
from router._faces.forward import Forwarder
from router._observe.decisionlog import DecisionLog
from router._observe.metrics import Metrics
from router._sessions.session import Sessions

logger = logging.getLogger(__name__)


async def _probe_pool(engine: DecisionEngine) -> None:
    """Name each engine of a pool that fails its probe (the pool is ready when one answers, so a broken failover
    would show only in an outage)."""
    inner = engine.engine if isinstance(engine, CachedEngine) else engine
    if not isinstance(inner, FailoverEngine):
        return
    for index, (name, error) in enumerate(await inner.probe_each()):
        if error is None:
            continue
        if index == 0:
            logger.warning("engine.pool: the engine %r failed its probe (%s); the next engines decide", name, error)
        else:
            logger.warning("engine.pool: the engine %r cannot take over: it failed its probe (%s)", name, error)


class Lifecycle:
    """What the proxy opens and closes, and its configuration's reload."""

    service: RouterService
    sessions: Sessions
    forwarder: Forwarder
    ready: bool
    ready_error: str | None
    on_startup: list[Callable[[], Any]]
    _background: list[Any]
    access: Access
    clock: Callable[[], float]
    _probed_at: float | None
    _owns_engine: bool
    _closed: bool
    _generation: Generation
    admission: Admission
    _retiring: set[asyncio.Task[Any]]
    _reload_lock: asyncio.Lock
    # Set by `d3router serve` (router/_faces/serve.py settle_gc): the collector was settled after start-up, and is
    # settled again once a reload's replaced configuration has served its last request (gcpauses.resettle).
    resettle: Callable[[], None] | None = None

    @property
    def config(self) -> Config:
        return self.service.config

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # the server must say why it cannot start, then stop
                    logger.error("d3router cannot start: %s", exc)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Open the decision log, start and probe the engine, run the `on_startup` hooks."""
        self.service.decision_log = open_decision_log(self.config, self.service.metrics)
        if self.service.engine is not None:
            await start_engine(self.service.engine)
            self._probed_at = self.clock()
            await self.check_engine()
            await _probe_pool(self.service.engine)
        self._background = [hook() for hook in self.on_startup]
        self._background.append(self.service.metrics.follow_engine_pool(self.service.engine))

    async def check_engine(self) -> bool:
        """Probe the engine (one without a probe is taken as ready: its first failure will say otherwise);
        `/readyz` reports the outcome. A failing engine does not stop the router."""
        engine = self.service.engine
        if engine is None:
            return True
        probe = getattr(engine, "probe", None)
        try:
            if probe is not None:
                await probe()
        except EngineError as exc:
            self.ready, self.ready_error = False, str(exc)
            logger.warning("the decision engine is not ready: %s; policies follow on_engine_error", exc)
            return False
        self.ready, self.ready_error = True, None
        return True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close what the app opened; safe to call again."""
        if self._closed:
            return
        self._closed = True
        for task in self._background:
            if hasattr(task, "cancel"):
                task.cancel()
        await self.service.aclose()
        if self._owns_engine and self.service.engine is not None:
            await self.service.engine.aclose()
        await self.forwarder.aclose()
        await self.sessions.store.aclose()
        for task in self._retiring:
            task.cancel()
        log, self.service.decision_log = self.service.decision_log, None
        if log is not None:
            await asyncio.to_thread(log.close)  # every queued line written

    def hangup(self) -> None:
        """SIGHUP: reopen the decision log (log rotation moved it) and reload the configuration file."""
        if isinstance(self.service.decision_log, DecisionLog):  # a stream a library caller gave is theirs
            self.service.decision_log.reopen()
        task = asyncio.get_running_loop().create_task(self.areload())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # --- reload ---------------------------------------------------------------------------------------------------
    def enter(self) -> Generation:
        """A request starts under the current configuration: `leave` it when it ends (the old one's resources are
        closed once its last request left)."""
        generation = self._generation
        generation.users += 1
        return generation

    async def areload(self) -> Reloaded:
        """`reload` off the event loop: the file read and parsed, the keys file read and the decision log opened on a
        worker thread; then the swap, on the loop. One reload at a time (the watcher, SIGHUP and /admin/reload may
        meet): a second one builds on what the first swapped in."""
        async with self._reload_lock:
            file = self.config.file
            try:
                config = await asyncio.to_thread(load_config, file)
                built = await asyncio.to_thread(self._build, config)
            except (ConfigError, RuntimeError, OSError) as exc:
                return self._refused(file, exc)
            return self._swap(built)

    def reload(self) -> Reloaded:
        """Load the configuration file again and swap it in whole; a broken file keeps the running one."""
        file = self.config.file
        try:
            config = load_config(file)
        except (ConfigError, OSError) as exc:
            return self._refused(file, exc)
        return self.apply(config)

    def apply(self, config: Config) -> Reloaded:
        """Swap in `config` with everything it needs, built first: a failure anywhere keeps the running
        configuration whole (one log line, the reason returned). What needs a restart is said, not half-applied."""
        try:
            built = self._build(config)
        except (ConfigError, RuntimeError, OSError) as exc:
            return self._refused(config.file, exc)
        return self._swap(built)

    def _build(self, config: Config) -> _Built:
        """Everything `config` needs that can fail (its checks, the keys file, a new decision log), touching nothing
        in force: safe on a worker thread."""
        old = self.config
        self.service.check(config)
        keys = self.access.build(config)  # the keys file too; a broken one keeps the running keys and configuration
        log = self.service.decision_log
        if config.server.decision_log != old.server.decision_log or Path(config.file) != Path(old.file):
            log = open_decision_log(config, self.service.metrics)
        return _Built(config, old, keys, log)

    def _swap(self, built: _Built) -> Reloaded:
        """The swap, in one step: nothing here can fail."""
        config, old, log = built.config, built.old, built.log
        restart = restart_needed(old, config)
        retired_log = self.service.decision_log if log is not self.service.decision_log else None
        self.service.decision_log = log
        self.service.swap(config)
        self.access.use(config, built.keys)
        if "server.sessions.salt_env" not in restart:
            self.sessions.settings = config.server.sessions
        pools = self.forwarder.retire(config)
        self.admission.max_requests = config.server.max_concurrent_requests
        self.admission.max_bytes = config.server.max_buffered_bytes
        previous, self._generation = self._generation, Generation()
        if retired_log is not None or pools or self.resettle is not None:
            self._retire(previous, retired_log, pools)
        for setting in restart:
            if setting == "engine":
                logger.warning("the engine section changed; engine changes take effect on restart")
            else:
                logger.warning("%s changed; it takes effect on restart", setting)
        if retired_log is not None or (log is not None and old.server.decision_log is None):
            logger.info("decision log: now %s", config.server.decision_log)
        logger.info("reloaded %s: %d policies", config.file, len(config.policies))
        return Reloaded(True, f"reloaded {config.file}", tuple(restart))

    def _refused(self, file: str, exc: BaseException) -> Reloaded:
        logger.error("reload of %s failed, keeping the running configuration: %s", file, str(exc).replace("\n", "; "))
        return Reloaded(False, str(exc), ())

    def _retire(self, generation: Generation, log: DecisionLog | TextIO | None, pools: list[Any]) -> None:
        """Close what only the old configuration used once its last request ended."""

        async def retire() -> None:
            await generation.idle()
            if log is not None:
                await asyncio.to_thread(log.close)
            await self.forwarder.close_retired(pools)
            if self.resettle is not None:  # the old configuration's cycles freed, the new one's objects frozen
                self.resettle()

        task = asyncio.get_running_loop().create_task(retire()) if _loop_running() else None
        if task is None:  # a reload outside the loop (a library caller): nothing is in flight; the retired pools
            if log is not None:  # stay retired and close with the app (closing needs the loop)
                log.close()
            return
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)


@dataclass(frozen=True)
class _Built:
    """What a reload built for its swap: the configuration, the one it replaces, its keys and decision log."""

    config: Config
    old: Config
    keys: dict[bytes, Any]
    log: DecisionLog | TextIO | None


@dataclass(frozen=True, slots=True)
class Reloaded:
    """What a reload did: `ok`, the message (the reason, when it failed), the settings that need a restart."""

    ok: bool
    message: str
    restart: tuple[str, ...] = ()

    def __getitem__(self, index: int) -> bool | str:  # `ok, message = app.reload()` as before
        return (self.ok, self.message)[index]

    def __iter__(self) -> Iterator[bool | str]:
        return iter((self.ok, self.message))


class Generation:
    """The requests served under one configuration, counted, so that what only it used closes after the last."""

    __slots__ = ("_idle", "users")

    def __init__(self) -> None:
        self.users = 0
        self._idle: asyncio.Event | None = None

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0 and self._idle is not None:
            self._idle.set()

    async def idle(self) -> None:
        if self.users:
            self._idle = asyncio.Event()
            await self._idle.wait()


def open_decision_log(config: Config, metrics: Metrics) -> DecisionLog | None:
    """The configured decision log (a path relative to the configuration file's folder, as model paths are)."""
    settings = config.server.decision_log
    if settings is None:
        return None
    return DecisionLog.open(Path(config.file).parent / settings.path, metrics)


RESTART_SETTINGS = ("engine", "server.redis", "server.redis_timeout_s", "server.sessions.salt_env")


def restart_needed(old: Config, new: Config) -> list[str]:
    """The settings that changed but only take effect on a restart: the engine and where shared state lives."""
    values = {
        "engine": (old.engine, new.engine),
        "server.redis": (old.server.redis, new.server.redis),
        "server.redis_timeout_s": (old.server.redis_timeout_s, new.server.redis_timeout_s),
        "server.sessions.salt_env": (old.server.sessions.salt_env, new.server.sessions.salt_env),
    }
    return [name for name in RESTART_SETTINGS if values[name][0] != values[name][1]]


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
