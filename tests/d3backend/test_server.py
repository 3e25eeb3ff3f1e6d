"""VllmServer's failure paths: a server that dies or never answers fails with its log, and leaves nothing running."""

from __future__ import annotations

import os
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
