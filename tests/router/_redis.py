"""A `redis-server` of a test's own (issue 12: no test may depend on a Redis some other process started)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.exceptions import RedisError

from d3backend import free_port

REDIS = shutil.which("redis-server")
if REDIS is None:  # a missing install is a failure to see, never a silent skip: .ci/setup installs it
    pytest.fail(
        "redis-server is not installed; run `bash .ci/setup` (it installs Debian's redis-server)", pytrace=False
    )


class RedisServer:
    """A redis-server of this test's own, on a free port, without persistence; stopped by its PID."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        assert REDIS is not None
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                with Redis(port=self.port, socket_timeout=1) as client:
                    client.ping()
                return self
            except (OSError, RedisError):  # not up yet
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    pytest.fail(f"redis-server on port {self.port} did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)  # killed, as a crash would: no goodbye to the clients
            self.process.wait(timeout=10)
        self.process = None

    def client(self) -> Redis:
        return Redis(port=self.port, socket_timeout=2, decode_responses=True)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
