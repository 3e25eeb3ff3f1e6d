"""The proxy's lifecycle: its lifespan (start the engine, open the decision log, run the startup hooks), readiness,
closing what it opened, and reloading its configuration file.

`ProxyApp` (proxy.py beside this) is a `Lifecycle`; the request paths live there, the app's life here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from starlette.types import Receive, Send

from d3backend import EngineError
from policies import Config, ConfigError, load_config
from router._decision.engines import start_engine
from router._decision.service import RouterService
from router._faces.auth import Access
from router._faces.forward import Forwarder
from router._sessions.session import Sessions

logger = logging.getLogger(__name__)


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
        self._open_decision_log()
        if self.service.engine is not None:
            await start_engine(self.service.engine)
            self._probed_at = self.clock()
            await self.check_engine()
        self._background = [hook() for hook in self.on_startup]
        self._background.append(self.service.metrics.follow_engine_pool(self.service.engine))

    def _open_decision_log(self, reopen: bool = False) -> None:
        """Open the configured decision log (a path relative to the configuration file's folder, as model paths
        are); on reload, close the old one and open the new one, or none."""
        if reopen and self.service.decision_log is not None:
            self.service.decision_log.close()
            self.service.decision_log = None
            logger.info("decision log: now %s", self.config.server.decision_log)
        log = self.config.server.decision_log
        if log is not None and self.service.decision_log is None:
            path = Path(self.config.file).parent / log.path
            path.parent.mkdir(parents=True, exist_ok=True)
            self.service.decision_log = open(path, "a", encoding="utf-8")

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
        if self.service.decision_log is not None:
            self.service.decision_log.close()
            self.service.decision_log = None

    def reload(self) -> tuple[bool, str]:
        """Load the configuration file again and swap it in whole; a broken file keeps the running one."""
        old = self.config
        file = old.file
        try:
            config = load_config(file)
            self.access.reload(config)  # the keys file too; a broken one keeps the running keys and configuration
            self.service.swap(config)
        except (ConfigError, RuntimeError) as exc:
            logger.error("reload of %s failed, keeping the running configuration:\n%s", file, exc)
            return False, str(exc)
        if config.engine != old.engine:
            logger.warning("the engine section changed; engine changes take effect on restart")
        if config.server.decision_log != old.server.decision_log:
            self._open_decision_log(reopen=True)
        logger.info("reloaded %s: %d policies", file, len(config.policies))
        return True, f"reloaded {file}"
