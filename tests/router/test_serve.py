"""`d3router serve` as a process: invalid files, hot reload on change and on SIGHUP, clean exit on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from d3backend import free_port
from router._cli import main

CONFIG = """
upstreams: {{small: {{url: "http://127.0.0.1:9/v1"}}}}
policies:
{policies}
"""


def policies(*names: str) -> str:
    return "\n".join(f"  {name}: {{rules: [{{name: default, route: small}}]}}" for name in names)


def test_serve_refuses_an_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("upstreams: {}\n", encoding="utf-8")
    assert main(["serve", str(path)]) == 2
    assert "upstreams: expected at least 1 item(s), found 0" in capsys.readouterr().err


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(policies=policies("first")), encoding="utf-8")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(path), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail(process.communicate()[0].decode())
            time.sleep(0.1)
    yield url, path, process
    if process.poll() is None:
        process.kill()
        process.wait(10)


def models(url: str) -> list[str]:
    return [model["id"] for model in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]]


def wait_for(check: object, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_hot_reload_on_change_and_sighup(served: tuple[str, Path, subprocess.Popen[bytes]]) -> None:
    url, path, process = served
    assert models(url) == ["first"]
    path.write_text(CONFIG.format(policies=policies("first", "second")), encoding="utf-8")
    assert wait_for(lambda: models(url) == ["first", "second"]), "the changed file was not picked up"
    path.write_text("policies: [broken\n", encoding="utf-8")
    time.sleep(2.5)
    assert models(url) == ["first", "second"]  # a broken file keeps the running configuration
    path.write_text(CONFIG.format(policies=policies("third")), encoding="utf-8")
    process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: models(url) == ["third"])
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=20)[0].decode()
    assert process.returncode == 0
    assert "reload of" in output and "failed, keeping the running configuration" in output
    assert "serving" in output and "http://127.0.0.1:" in output
    assert "Traceback" not in output


def test_workers_need_a_remote_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(policies="  auto: {questions: {j: {type: noul}}, rules: [{name: a, when: j > 0.5,"
                                  " route: small}, {name: default, route: small}]}"), encoding="utf-8")  # fmt: skip
    assert main(["serve", str(path), "--workers", "2"]) == 2


def test_two_workers_serve_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(policies=policies("first")), encoding="utf-8")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(path), "--port", str(port),
                                "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _alive(url), 30), "the workers did not start"
        assert all(models(url) == ["first"] for _ in range(10))
        path.write_text(CONFIG.format(policies=policies("second")), encoding="utf-8")
        assert wait_for(lambda: all(models(url) == ["second"] for _ in range(10)), 10), "not every worker reloaded"
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    assert "with 2 workers" in output
    assert output.count("Application startup complete") == 2


def _alive(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
