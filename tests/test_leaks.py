"""The per-test leak check (tests/_leaks.py), run on a small suite in a pytest subprocess: each leaky test fails at
its own teardown, named with what it left; a clean test, a fixture of wider scope and a thread already stopping do
not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LEAKY = """
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests._leaks import lives_until_exit

HELD = []  # released by conftest.py at the session's end, after every check
TASKS = []
STOP = threading.Event()


class Server:
    # a listening socket that keeps the connections it accepts, as a server keeping them alive would

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.accepted = []

    def connect(self):
        client = socket.create_connection(self.socket.getsockname())
        self.accepted.append(self.socket.accept()[0])
        return client

    def close(self):
        for connection in [*self.accepted, self.socket]:
            connection.close()


@pytest.fixture(scope="module")
def listening():  # held across the module's tests by design, with what it accepts: never a leak
    server = Server()
    yield server
    server.close()


@pytest.fixture
def held_socket():  # a function-scoped fixture that never closes what it opened: a leak of its test
    client = socket.socket()
    HELD.append(client)
    return client


def test_clean():
    with socket.create_server(("127.0.0.1", 0)):
        pass


def test_uses_module_fixture_1(listening):
    pass


def test_leaks_socket():
    HELD.append(socket.create_server(("127.0.0.1", 0)))


def test_drops_socket_in_a_cycle():  # freed only by the collector: attributed here, not to a later test
    cycle = [socket.socket()]
    cycle.append(cycle)


def test_leaks_socket_in_fixture(held_socket):
    pass


def test_leaks_thread():
    threading.Thread(target=STOP.wait, name="leaky-thread", daemon=True).start()


def test_thread_stopping():  # ends a moment after its test: waited for, not a leak
    threading.Thread(target=time.sleep, args=(0.2,), name="stopping-thread").start()


def test_declares_what_lives_until_exit():
    with lives_until_exit("this suite's conftest.py closes it at the session's end"):
        HELD.append(open(__file__))


def test_leaks_process():
    HELD.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))


def test_leaves_a_zombie():  # exited, never waited for
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, without reaping it
    HELD.append(process)


def test_leaks_task():
    loop = asyncio.new_event_loop()
    HELD.append(loop)
    TASKS.append(loop.create_task(asyncio.sleep(60), name="leaky-task"))


def test_uses_module_fixture_2(listening):
    with listening.connect():
        pass


def test_leaks_connection_to_module_fixture(listening):  # the client's end is the test's
    HELD.append(listening.connect())


def release():
    STOP.set()
    for thing in HELD:
        if isinstance(thing, subprocess.Popen):
            thing.kill()
            thing.wait()
        elif isinstance(thing, asyncio.AbstractEventLoop):
            for task in TASKS:
                task.cancel()
            thing.run_until_complete(asyncio.sleep(0))
            thing.close()
        else:
            thing.close()
"""

CONFTEST = """
import sys


def pytest_sessionfinish():
    sys.modules["test_leaky"].release()
"""

EXPECTED = {  # test -> what its report names
    "test_leaks_socket": r"fd \d+ -> socket:\[\d+\] \(tcp 127\.0\.0\.1:\d+ -> 0\.0\.0\.0:0\)",
    "test_drops_socket_in_a_cycle": r"ResourceWarning: unclosed <socket\.socket fd=\d+",
    "test_leaks_socket_in_fixture": r"fd \d+ -> socket:\[\d+\]",
    "test_leaks_thread": r"thread 'leaky-thread' \(daemon\)",
    "test_leaks_process": r"process \d+ \(running\): \S*python\S* -c import time; time\.sleep\(60\)",
    "test_leaves_a_zombie": r"process \d+ \(exited, never waited for\): ",
    "test_leaks_task": r"asyncio task <Task pending name='leaky-task'",
    "test_leaks_connection_to_module_fixture": r"fd \d+ -> socket:\[\d+\] \(tcp 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:\d+\)",
}


def run(tmp_path: Path) -> tuple[int, str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n", encoding="utf-8")
    (tmp_path / "test_leaky.py").write_text(LEAKY, encoding="utf-8")
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests._leaks", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-q", "-rE", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return completed.returncode, completed.stdout + completed.stderr


def report(output: str, test: str) -> str:
    return output.split(f"test_leaky.py::{test} left behind")[1].split("ERROR ")[0]


def test_each_leak_fails_its_own_test_named_with_what_it_left(tmp_path: Path) -> None:
    code, output = run(tmp_path)
    assert code == 1, output
    failed = set(re.findall(r"^ERROR test_leaky\.py::(\w+)", output, re.MULTILINE))
    assert failed == set(EXPECTED), output
    for test, leaked in EXPECTED.items():
        assert re.search(leaked, report(output, test)), (test, output)
    # the client's end only: the end the module's server accepted is the server's
    assert report(output, "test_leaks_connection_to_module_fixture").count(" fd ") == 1, output
    assert f"{LEAKY.count(chr(10) + 'def test_')} passed, {len(EXPECTED)} errors in" in output, output  # calls pass
