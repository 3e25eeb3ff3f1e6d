"""`VllmServer`: a vLLM server in a child process on loopback, for tests, benchmarks and the offline demo.

    server = VllmServer(model_dir, served_model_name="d3-tiny", workdir=tmp)
    server.start()                 # returns once /health answers (21-30 s on the CPU build)
    ...  http://127.0.0.1:{server.port}
    server.stop()                  # the whole process group, within a few seconds

The server runs in its own process group, with its caches and temporary files in `workdir`, and its output in
`workdir/vllm.log`, which the startup error quotes when it does not come up.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from d3backend import _vllm


class ServerError(RuntimeError):
    """The server did not come up; the message ends with the tail of its log."""


_HANDED_OUT: set[int] = set()  # every port `free_port` has returned in this process
_DRAW = random.SystemRandom()  # not the `random` module's state, which a test runner may seed alike for every test


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (32768 unless configured otherwise)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port nothing is bound to now, for a server started next. Never one this process has returned
    before, so that two ports drawn before either server binds differ (two drawn alike once let a benchmark's second
    upstream fail to bind while the first answered for both). Drawn below the ephemeral range, so that an outgoing
    connection cannot take it before the server binds; from the kernel's own choice when that range starts too low."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _DRAW.randrange(10_000, low) if low > 11_000 else _bound_port()
        if port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    raise OSError("no free loopback port found in 200 draws")


def _bound_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class VllmServer:
    def __init__(
        self,
        model: str | Path,
        *,
        workdir: str | Path,
        served_model_name: str = "d3-tiny",
        port: int | None = None,
        max_model_len: int = 2048,
        dtype: str = "float32",
        kv_cache_memory_bytes: str = "256M",
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        self.model = str(model)
        self.served_model_name = served_model_name
        self.port = port or free_port()
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "vllm.log"
        self.argv = [
            python, "-m", _vllm.SERVER_MODULE,
            "--model", self.model, "--served-model-name", served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(max_model_len), "--dtype", dtype,
            "--kv-cache-memory-bytes", kv_cache_memory_bytes,
            *_vllm.cpu_args(), *extra_args,
        ]  # fmt: skip
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The server's process id (0 when it is not running)."""
        return self._process.pid if self._process is not None else 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 240.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, **_vllm.cpu_environment(self.workdir / "cache"), "TMPDIR": str(tmp)}
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # set but empty, it crashes the engine (CPU_ENGINE.md)
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, cwd=self.workdir,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerError(f"vLLM exited with {self._process.returncode} while starting{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"vLLM did not answer /health within {timeout_s:g} s{self._log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=timeout_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"; the end of {self.log_path}:\n" + "\n".join(text)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
