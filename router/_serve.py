"""`d3router serve`: the proxy under uvicorn, with hot reload of the configuration file (on change and SIGHUP)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from contextlib import suppress

import uvicorn

from policies import Config
from router._app import ProxyApp

logger = logging.getLogger("router")


async def serve(config: Config, host: str, port: int, *, log_level: str = "info", poll_s: float = 1.0) -> int:
    """Serve until SIGINT/SIGTERM; return the process exit code."""
    app = ProxyApp(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=10,
        )
    )
    loop = asyncio.get_running_loop()
    with suppress(NotImplementedError):  # no signals on some platforms
        loop.add_signal_handler(signal.SIGHUP, app.reload)
    watcher = asyncio.create_task(_watch(app, poll_s))
    policies = ", ".join(config.policies) or "none"
    logger.info("d3router: serving %s on http://%s:%d (policies: %s)", config.file, host, port, policies)
    try:
        await server.serve()
    finally:
        watcher.cancel()
    return 0 if server.started else 3


async def _watch(app: ProxyApp, poll_s: float) -> None:
    """Reload when the configuration file changes (its mtime and size)."""
    path = app.config.file

    def stamp() -> tuple[float, int] | None:
        try:
            info = os.stat(path)
        except OSError:
            return None
        return info.st_mtime, info.st_size

    last = stamp()
    while True:
        await asyncio.sleep(poll_s)
        now = stamp()
        if now is not None and now != last:
            last = now
            app.reload()
