"""The embedded engine's reaper (`d3backend._embedded._reap`) on real child processes.

It waits for the processes vLLM started and kills only those still running. A process that something else reaped
first is gone, though `is_alive()` stays true for good (`waitpid` fails with ECHILD): the reaper must not kill its
pid, which the system may have given to another process by then.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import time
from collections.abc import Iterator

import pytest

from d3backend._embedded import _reap, exited

SPAWN = multiprocessing.get_context("spawn")  # what vLLM uses; its resource tracker lives until the interpreter ends


@pytest.fixture
def before() -> Iterator[set[multiprocessing.process.BaseProcess]]:
    yield set(multiprocessing.active_children())


def test_the_reaper_spares_a_process_that_another_waiter_reaped(
    before: set[multiprocessing.process.BaseProcess], caplog: pytest.LogCaptureFixture
) -> None:
    process = SPAWN.Process(target=time.sleep, args=(0,), name="reaped-elsewhere")
    process.start()
    assert process.pid is not None
    killed: list[int] = []
    try:
        os.waitpid(process.pid, 0)  # another waiter reaps it: from here on `is_alive()` cannot learn it ended
        assert process.is_alive() and exited(process)
        process.kill = lambda: killed.append(1)  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="d3backend._embedded"):
            _reap(before, timeout_s=0.05)
        assert killed == []
        assert not [r for r in caplog.records if "killing" in r.getMessage()]
    finally:  # `close()` refuses a process it thinks alive: drop it from multiprocessing's children by hand
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        process._popen.finalizer()  # type: ignore[attr-defined]  # closes the sentinel pipe


def test_the_reaper_kills_a_process_that_outlives_the_shutdown(
    before: set[multiprocessing.process.BaseProcess], caplog: pytest.LogCaptureFixture
) -> None:
    process = SPAWN.Process(target=time.sleep, args=(600,), name="lingering")
    process.start()
    try:
        with caplog.at_level(logging.WARNING, logger="d3backend._embedded"):
            _reap(before, timeout_s=0.2)
        assert exited(process) and process.exitcode == -signal.SIGKILL
        assert [r.getMessage() for r in caplog.records] == [
            f"killing vLLM's process lingering (pid {process.pid}), still alive after shutdown"
        ]
    finally:
        if not exited(process):
            process.kill()
            process.join()
        process.close()


def test_the_reaper_leaves_alone_the_processes_it_was_told_predate_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    process = SPAWN.Process(target=time.sleep, args=(600,), name="older")
    process.start()
    try:
        with caplog.at_level(logging.WARNING, logger="d3backend._embedded"):
            _reap(set(multiprocessing.active_children()), timeout_s=0.05)
        assert not exited(process) and caplog.records == []
    finally:
        process.kill()
        process.join()
        process.close()
