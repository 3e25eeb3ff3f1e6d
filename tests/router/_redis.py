"""A `redis-server` of a test's own (issue 12: no test may depend on a Redis some other process started)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
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
    """A redis-server of this test's own, on a free port, without persistence; stopped by its PID.

    `cluster=True`: a one-node Redis Cluster (cluster-enabled, its own bus port and nodes file, every slot assigned
    with CLUSTER ADDSLOTSRANGE 0 16383), which refuses a command or script whose keys lie in two slots (CROSSSLOT)
    as a cluster of many nodes does, and answers everything else as one server (no MOVED: it holds every slot)."""

    def __init__(self, port: int | None = None, *, cluster: bool = False) -> None:
        self.port = port or free_port()
        self.cluster = cluster
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    def start(self) -> RedisServer:
        assert REDIS is not None
        command = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.cluster:
            self._dir = tempfile.mkdtemp(prefix="d3-redis-cluster-")  # its nodes.conf, never in the working dir
            command += ["--cluster-enabled", "yes", "--cluster-port", str(free_port()), "--dir", self._dir,
                        "--cluster-config-file", "nodes.conf"]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with Redis(port=self.port, socket_timeout=1) as client:
                    client.ping()
                    if self.cluster:
                        self._assign_slots(client, deadline)
                return self
            except (OSError, RedisError):  # not up yet
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    pytest.fail(f"redis-server on port {self.port} did not start")
                time.sleep(0.05)

    def _assign_slots(self, client: Redis, deadline: float) -> None:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        while "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO").decode():
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the redis cluster node on port {self.port} never reached cluster_state:ok")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)  # killed, as a crash would: no goodbye to the clients
            self.process.wait(timeout=10)
        self.process = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def client(self) -> Redis:
        return Redis(port=self.port, socket_timeout=2, decode_responses=True)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_cluster() -> Iterator[RedisServer]:
    server = RedisServer(cluster=True).start()
    try:
        yield server
    finally:
        server.stop()
