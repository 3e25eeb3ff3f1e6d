"""`d3router serve`: the proxy under uvicorn, with hot reload of the configuration file (on change and SIGHUP)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import uvicorn
from starlette.types import ASGIApp

from policies import Config
from router._app import ProxyApp

logger = logging.getLogger("router")
T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on uvloop where it is installed, the loop uvicorn itself would choose: a fifth less time
    per proxied request (benchmarks/router.py)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(main)
    return uvloop.run(main)


class _Server(uvicorn.Server):
    """uvicorn's server with our signal handling: it re-raises the signal after shutdown, which would cancel the
    tasks still closing the embedded engine; ours lets `serve` return and close everything first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(config: Config, host: str, port: int, *, log_level: str = "info", poll_s: float = 1.0) -> int:
    """Serve until SIGINT/SIGTERM (a second one forces the exit); return the process exit code."""
    app = ProxyApp(config)
    policies = ", ".join(config.policies) or "none"
    logger.info("d3router: serving %s on http://%s:%d (policies: %s)", config.file, host, port, policies)
    return await serve_app(app, host, port, log_level=log_level, poll_s=poll_s)


CONFIG_ENV = "D3ROUTER_CONFIG"


def serve_workers(config: Config, host: str, port: int, workers: int, *, log_level: str = "info") -> int:
    """Serve with `workers` processes (uvicorn's supervisor): each loads the file and watches it for changes;
    SIGHUP restarts the workers. The embedded engine lives in one process, so it needs `workers == 1`."""
    if config.engine.kind == "embedded" and any(policy.questions for policy in config.policies.values()):
        logger.error("--workers %d needs a remote engine: the embedded engine runs inside one process", workers)
        return 2
    os.environ[CONFIG_ENV] = os.path.abspath(config.file)
    logger.info("d3router: serving %s on http://%s:%d with %d workers", config.file, host, port, workers)
    uvicorn.run("router._serve:worker_app", factory=True, host=host, port=port, workers=workers, lifespan="on",
                log_level=log_level, access_log=False, server_header=False, date_header=False)  # fmt: skip
    return 0


def worker_app() -> ProxyApp:
    """The app of one worker process (`serve_workers`)."""
    from policies import load_config

    app = ProxyApp(load_config(os.environ[CONFIG_ENV]))
    watch_file(app)
    return app


def watch_file(app: ProxyApp, poll_s: float = 1.0) -> None:
    """Have `app` reload its file when it changes, from its startup until it closes (one watcher either way
    the router is served)."""
    app.on_startup.append(lambda: asyncio.create_task(_watch(app, poll_s)))


async def serve_app(app: ASGIApp, host: str, port: int, *, log_level: str = "info", poll_s: float = 1.0) -> int:
    """Run any ASGI app under uvicorn until SIGINT/SIGTERM; a `ProxyApp` also reloads its file on change/SIGHUP."""
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=10,
            server_header=False,  # the upstream's own headers pass through; uvicorn's would double them
            date_header=False,
        )
    )

    def stop() -> None:
        server.force_exit = server.should_exit
        server.should_exit = True

    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # no signals on some platforms
        loop.add_signal_handler(signal.SIGINT, stop)
        loop.add_signal_handler(signal.SIGTERM, stop)
        if isinstance(app, ProxyApp):
            loop.add_signal_handler(signal.SIGHUP, app.reload)
    if isinstance(app, ProxyApp):
        watch_file(app, poll_s)
    try:
        await server.serve()
    finally:
        if isinstance(app, ProxyApp):
            await app.aclose()  # after a forced exit the lifespan did not run its shutdown
    return 0 if server.started else 3


async def _watch(app: ProxyApp, poll_s: float) -> None:
    """Reload when the configuration file changes. A Kubernetes ConfigMap volume swaps a `..data` symlink to a new
    timestamped folder and leaves the file's own mtime and size as they may be, so the stamp also holds the path the
    symlinks resolve to and the inode they land on."""
    path = app.config.file

    def stamp() -> tuple[str, int, int, int, int] | None:
        try:
            real = os.path.realpath(path)
            info = os.stat(real)
        except OSError:
            return None
        return real, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size

    last = stamp()
    while True:
        await asyncio.sleep(poll_s)
        now = stamp()
        if now is not None and now != last:
            last = now
            app.reload()
