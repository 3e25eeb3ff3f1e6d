"""`d3router serve` as a process: invalid files, hot reload on change and on SIGHUP, clean exit on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from d3backend import free_port
from router._cli.main import main

CONFIG = """
upstreams: {{small: {{url: "http://127.0.0.1:9/v1"}}}}
policies:
{policies}
"""


WAIT_S = 30.0  # how long to wait for what takes a second (the file is polled each second): 10x and more


def policies(*names: str) -> str:
    return "\n".join(f"  {name}: {{rules: [{{name: default, route: small}}]}}" for name in names)


def test_serve_refuses_an_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("upstreams: {}\n", encoding="utf-8")
    assert main(["serve", str(path)]) == 2
    assert "upstreams: expected at least 1 item(s), found 0" in capsys.readouterr().err


class Output:
    """The process's output, read as it comes (in a thread), so a test can wait for a line."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with process.stdout:  # closed at the end of the output, as communicate() would
            for line in process.stdout:
                self.lines.append(line.decode(errors="replace"))

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def close(self) -> str:
        self._thread.join(WAIT_S)
        return self.text


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes], Output]]:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(policies=policies("first")), encoding="utf-8")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(path), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    output = Output(process)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                process.wait(WAIT_S)
                pytest.fail(output.close())
            time.sleep(0.1)
    yield url, path, process, output
    if process.poll() is None:
        process.kill()
        process.wait(10)
    output.close()


def models(url: str) -> list[str]:
    return [model["id"] for model in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]]


def wait_for(check: object, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_hot_reload_on_change_and_sighup(served: tuple[str, Path, subprocess.Popen[bytes], Output]) -> None:
    url, path, process, output = served
    assert models(url) == ["first"]
    path.write_text(CONFIG.format(policies=policies("first", "second")), encoding="utf-8")
    assert wait_for(lambda: models(url) == ["first", "second"]), "the changed file was not picked up"
    path.write_text("policies: [broken\n", encoding="utf-8")
    assert wait_for(lambda: "failed, keeping the running configuration" in output.text), output.text
    assert "reload of" in output.text
    assert models(url) == ["first", "second"]  # a broken file keeps the running configuration
    path.write_text(CONFIG.format(policies=policies("third")), encoding="utf-8")
    process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: models(url) == ["third"])
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=2 * WAIT_S) == 0
    text = output.close()
    assert "serving" in text and "http://127.0.0.1:" in text
    assert "Traceback" not in text


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
        assert wait_for(lambda: _alive(url), 120), "the workers did not start"
        assert all(models(url) == ["first"] for _ in range(10))
        path.write_text(CONFIG.format(policies=policies("second")), encoding="utf-8")
        assert wait_for(lambda: all(models(url) == ["second"] for _ in range(10))), "not every worker reloaded"
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
