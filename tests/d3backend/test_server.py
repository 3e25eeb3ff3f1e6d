"""VllmServer's failure paths: a server that dies or never answers fails with its log, and leaves nothing running."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from d3backend import ServerError, VllmServer, _server


def fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    script.chmod(0o755)
    return str(script)


def test_a_server_that_exits_fails_with_its_log(tmp_path: Path) -> None:
    python = fake_python(tmp_path, 'echo "model not found: $4" >&2; exit 3')
    server = VllmServer("/no/model", workdir=tmp_path / "w", python=python)
    with pytest.raises(
        ServerError,
        match=r"(?s)^vLLM exited with 3 while starting; the end of .*vllm\.log:\nmodel not found: /no/model$",
    ):
        server.start(timeout_s=10)


def test_a_server_that_never_answers_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "pid"
    python = fake_python(tmp_path, f'echo $$ > {pid_file}; echo "loading"; sleep 60')
    server = VllmServer("/no/model", workdir=tmp_path / "w", python=python)
    # The 1 s start timeout counts from when the script has said "loading", however slowly a loaded machine
    # started it: start()'s clock stands still until then (or for at most 60 s).
    began = time.monotonic()

    def clock() -> float:
        said = server.log_path.exists() and "loading" in server.log_path.read_text(encoding="utf-8")
        return time.monotonic() if said or time.monotonic() - began > 60 else began

    monkeypatch.setattr(_server, "time", SimpleNamespace(monotonic=clock, sleep=time.sleep))
    with pytest.raises(ServerError, match=r"(?s)did not answer /health within 1 s; .*\nloading$"):
        server.start(timeout_s=1)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.stop()  # stopping twice is fine


def test_argv_and_url(tmp_path: Path) -> None:
    server = VllmServer("/m", workdir=tmp_path, served_model_name="tiny", port=8123, python="py")
    assert server.url == "http://127.0.0.1:8123"
    assert server.argv[:3] == ["py", "-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert server.argv[3:9] == ["--model", "/m", "--served-model-name", "tiny", "--host", "127.0.0.1"]


def test_free_ports_drawn_before_any_is_bound_all_differ() -> None:
    """Two ports drawn before either server binds must differ: drawn alike once, a benchmark's second upstream failed
    to bind while the first answered for both (the stop-15 CI failure)."""
    ports = [_server.free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)
    low = _server._ephemeral_low()
    assert all(10_000 <= port < low for port in ports)  # where no outgoing connection draws its own port from


def test_a_free_port_is_not_one_something_listens_on(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = _server._bound_port()  # nothing on it
        draws = iter([busy, busy, free])
        monkeypatch.setattr(_server, "_DRAW", SimpleNamespace(randrange=lambda low, high: next(draws)))
        monkeypatch.setattr(_server, "_ephemeral_low", lambda: 65_000)
        monkeypatch.setattr(_server, "_HANDED_OUT", set())
        assert _server.free_port() == free


def test_with_an_ephemeral_range_starting_low_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server, "_ephemeral_low", lambda: 1024)
    monkeypatch.setattr(_server, "_DRAW", SimpleNamespace(randrange=pytest.fail))  # never drawn by hand
    assert 1024 <= _server.free_port() <= 65535


def test_no_free_port_at_all_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server, "_bindable", lambda port: False)
    with pytest.raises(OSError, match="no free loopback port found in 200 draws"):
        _server.free_port()
