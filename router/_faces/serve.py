"""`d3router serve`: the proxy under uvicorn, with hot reload of the configuration file (on change and SIGHUP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import uvicorn
from starlette.types import ASGIApp

from policies import Config
from router._faces.proxy import ProxyApp
from router._observe import gcpauses, logs

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

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit and self.started:  # uvicorn skips the app's shutdown then; run it, or the lifespan
            await self.lifespan.shutdown()  # task is cancelled at exit and logs a traceback


async def serve(
    config: Config, host: str, port: int, *, log_level: str = "info", poll_s: float = 1.0,
    log_config: dict[str, Any] | None = None,
) -> int:  # fmt: skip
    """Serve until SIGINT/SIGTERM (a graceful stop: see `_Shutdown`; a second signal forces the exit); return the
    process exit code. `log_config`: this process's logging (`router._observe.logs.log_config`), uvicorn's too."""
    if log_config is not None:
        logs.apply(log_config)
    app = ProxyApp(config)
    settle_gc(app)
    policies = ", ".join(config.policies) or "none"
    logger.info("d3router: serving %s on http://%s:%d (policies: %s)", config.file, host, port, policies)
    return await serve_app(app, host, port, log_level=log_level, poll_s=poll_s, log_config=log_config)


CONFIG_ENV = "D3ROUTER_CONFIG"
# How long a worker may not answer its supervisor (starting, or its loop stalled) before it is replaced.
WORKER_PING_S = 60
LOG_CONFIG_ENV = "D3ROUTER_LOG_CONFIG"  # the logging configuration, as JSON, for the workers (`worker_app`)


def serve_workers(
    config: Config, host: str, port: int, workers: int, *, log_level: str = "info",
    log_config: dict[str, Any] | None = None,
) -> int:  # fmt: skip
    """Serve with `workers` processes (uvicorn's supervisor): each loads the file and watches it for changes;
    SIGHUP restarts the workers. The embedded engine lives in one process, so it needs `workers == 1`."""
    if config.engine.kind == "embedded" and config.needs_engine:
        logger.error("--workers %d needs a remote engine: the embedded engine runs inside one process", workers)
        return 2
    os.environ[CONFIG_ENV] = os.path.abspath(config.file)
    if log_config is not None:
        logs.apply(log_config)
        os.environ[LOG_CONFIG_ENV] = json.dumps(log_config)
    logger.info("d3router: serving %s on http://%s:%d with %d workers", config.file, host, port, workers)
    # uvicorn's supervisor relays SIGTERM to the workers; they finish in-flight requests within grace_s (no drain:
    # on Kubernetes, scale with replicas of one process each). A worker that does not answer the supervisor's ping
    # within WORKER_PING_S is killed and replaced: uvicorn's 5 s killed workers still importing on a loaded 2-core
    # machine, again and again (tests/router/test_serve.py::test_two_workers_serve_and_reload, under CI's load).
    with metrics_dir():
        uvicorn.run("router._faces.serve:worker_app", factory=True, host=host, port=port, workers=workers,
                    lifespan="on", log_level=log_level, access_log=False, server_header=False, date_header=False,
                    log_config=uvicorn.config.LOGGING_CONFIG if log_config is None else log_config,
                    timeout_graceful_shutdown=config.server.grace_s,
                    timeout_worker_healthcheck=WORKER_PING_S)  # fmt: skip
    return 0


@contextlib.contextmanager
def metrics_dir() -> Iterator[str]:
    """A fresh directory for prometheus_client's multi-process mode, named to the workers (they import the
    library after this is set), removed with everything in it when the run ends."""
    from router._observe.metrics import MULTIPROC_ENV

    path = tempfile.mkdtemp(prefix="d3router-metrics-")
    before = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        if before is None:
            del os.environ[MULTIPROC_ENV]
        else:
            os.environ[MULTIPROC_ENV] = before
        shutil.rmtree(path, ignore_errors=True)


def worker_app() -> ProxyApp:
    """The app of one worker process (`serve_workers`)."""
    from policies import load_config
    from router._observe import tracing

    if os.environ.get(LOG_CONFIG_ENV):
        logs.apply(json.loads(os.environ[LOG_CONFIG_ENV]))
    tracing.configure()  # each worker its own exporter (flushed when its process ends)
    app = ProxyApp(load_config(os.environ[CONFIG_ENV]))
    watch_file(app)
    settle_gc(app)
    return app


def settle_gc(app: ProxyApp) -> None:
    """Once `app` has started: `gcpauses.settle()` (start-up's objects frozen out of the collector's way, fewer young
    collections), and its garbage collection pauses recorded in its metrics until it closes (issue 31.5)."""

    def settled() -> gcpauses.Pauses:
        gcpauses.settle()
        app.resettle = gcpauses.resettle  # again after each reload, once the old configuration retired
        pauses = gcpauses.Pauses(app.service.metrics).install()
        pauses.follow()
        return pauses  # the app's close cancels it: recording stops

    app.on_startup.append(settled)


def watch_file(app: ProxyApp, poll_s: float = 1.0) -> None:
    """Have `app` reload its file when it changes, from its startup until it closes (one watcher either way
    the router is served)."""
    app.on_startup.append(lambda: asyncio.create_task(_watch(app, poll_s)))


async def serve_app(
    app: ASGIApp, host: str, port: int, *, log_level: str = "info", poll_s: float = 1.0, drain_s: float = 0.0,
    grace_s: int = 10, log_config: dict[str, Any] | None = None,
) -> int:  # fmt: skip
    """Run any ASGI app under uvicorn until SIGINT/SIGTERM (see `_Shutdown`); a `ProxyApp` also reloads its file on
    change/SIGHUP and takes `drain_s`/`grace_s` from its configuration's `server` section instead."""
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=grace_s,
            server_header=False,  # the upstream's own headers pass through; uvicorn's would double them
            date_header=False,
            log_config=uvicorn.config.LOGGING_CONFIG if log_config is None else log_config,
        )
    )
    shutdown = _Shutdown(server, app, drain_s, grace_s)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # no signals on some platforms
        loop.add_signal_handler(signal.SIGINT, shutdown.interrupt)
        loop.add_signal_handler(signal.SIGTERM, shutdown.terminate)
        if isinstance(app, ProxyApp):
            loop.add_signal_handler(signal.SIGHUP, app.hangup)
    if isinstance(app, ProxyApp):
        watch_file(app, poll_s)
    try:
        await server.serve()
    finally:
        shutdown.cancel()
        if isinstance(app, ProxyApp):
            await app.aclose()  # after a forced exit the lifespan did not run its shutdown
    return 0 if server.started else 3


class _Shutdown:
    """A graceful stop for rolling updates (issue 14). SIGTERM: `/readyz` answers 503 at once, new connections are
    still served for `drain_s` (the load balancer's lag in seeing it), then the listener closes (new connections
    are refused) and in-flight requests and streams get `grace_s` to finish; the connections still open then are
    closed, as if their clients had left (the app cancels their upstream requests), and the process exits 0.
    SIGINT (Ctrl-C) skips the drain. A second signal forces the exit at once."""

    def __init__(self, server: uvicorn.Server, app: ASGIApp, drain_s: float, grace_s: int) -> None:
        self.server, self.app = server, app
        self.drain_s, self.grace_s = drain_s, grace_s
        self.task: asyncio.Task[None] | None = None

    def terminate(self) -> None:
        self._stop(drain=True)

    def interrupt(self) -> None:
        self._stop(drain=False)

    def _stop(self, *, drain: bool) -> None:
        if self.task is not None or self.server.should_exit:
            logger.warning("d3router: second signal, exiting now without waiting for in-flight requests")
            self.cancel()
            self.server.force_exit = self.server.should_exit = True
            return
        drain_s, grace_s = self.drain_s, self.grace_s
        if isinstance(self.app, ProxyApp):  # read now: a reload may have changed them
            self.app.draining = True
            drain_s, grace_s = self.app.config.server.drain_s, self.app.config.server.grace_s
        # uvicorn's own timeout cancels the request tasks, which it logs as errors with tracebacks; ours closes the
        # connections first, and uvicorn's stays as a backstop for a task that ignores its client leaving.
        self.server.config.timeout_graceful_shutdown = grace_s + 5
        self.task = asyncio.get_running_loop().create_task(self._run(drain_s if drain else 0.0, grace_s))

    async def _run(self, drain_s: float, grace_s: int) -> None:
        if drain_s > 0:
            logger.info("d3router: draining: /readyz answers 503, new connections are served for %g s more", drain_s)
            await asyncio.sleep(drain_s)
        logger.info("d3router: stopping: new connections are refused, in-flight requests get %d s", grace_s)
        self.server.should_exit = True
        await asyncio.sleep(grace_s)
        connections = list(self.server.server_state.connections)
        if connections:
            logger.warning("d3router: grace timeout (%d s): closing %d connections still open", grace_s,
                           len(connections))  # fmt: skip
        for connection in connections:
            if connection.transport is not None:
                connection.transport.close()

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


async def _watch(app: ProxyApp, poll_s: float) -> None:
    """Reload when the configuration file (or its keys file) changes. A Kubernetes ConfigMap volume swaps a `..data`
    symlink to a new timestamped folder and leaves the file's own mtime and size as they may be, so the stamp also
    holds the path the symlinks resolve to and the inode they land on."""

    def one(path: str) -> tuple[str, int, int, int, int] | None:
        try:
            real = os.path.realpath(path)
            info = os.stat(real)
        except OSError:
            return None
        return real, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size

    def stamp() -> tuple[tuple[str, int, int, int, int] | None, ...] | None:
        """The configuration file's stamp, and its keys file's (server.auth.keys_file: a rotated secret)."""
        config = one(app.config.file)
        auth = app.config.server.auth
        if config is None or auth is None or auth.keys_file is None:
            return None if config is None else (config,)
        return config, one(os.path.join(os.path.dirname(app.config.file), auth.keys_file))

    last = stamp()
    while True:
        await asyncio.sleep(poll_s)
        now = stamp()
        if now is not None and now != last:
            last = now
            try:
                await app.areload()  # a failure is logged and answered there; the watcher goes on
            except Exception:  # anything unforeseen must not end the watcher: no reload would happen after it
                logger.exception("reload of %s failed unexpectedly; watching for the next change", app.config.file)
