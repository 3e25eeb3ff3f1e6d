"""A pytest plugin: a test that leaves behind a file descriptor (a socket, a pipe, a file), a thread, an asyncio task
or a child process fails at its own teardown, named, with what it left (issue 24: a socket some earlier test left
open failed a random later test, on the `ResourceWarning` its garbage collection raised there).

How a test is checked:
1. A snapshot is taken when its setup starts and again when its teardown (its function-scoped fixtures included)
   has ended; what the second has and the first had not is a leak.
2. Fixtures of a wider scope (the session's `vllm_server`, a module's router process) hold resources across tests
   by design: what appears while one of them is set up is owned by it until it is finalized, and never a leak. So
   is a connection accepted by a listening socket it owns, during a test (a module's upstream that the router it
   serves keeps a connection to); the client's end, if the test made it, still counts.
3. At the check, `gc.collect()` runs with `ResourceWarning` as an error: an unclosed socket or subprocess in a
   reference cycle is attributed to the test that dropped it, not to whichever later test the collector ran in.
   So is an asyncio task destroyed while pending (logged by asyncio, not warned). Then `gc.freeze()`: the next
   check's collection walks only what was allocated since, well under 1 ms, instead of the whole heap (measured:
   37 ms for the 82,000 objects of the three packages imported, more once vLLM is, x 1,300 tests); the whole check
   costs about 2.5 ms a test (tests/policies: 280 tests, 0.7 s). The price: garbage in a cycle with an object older
   than the test that made it is kept until the session ends, where the plugin unfreezes and pytest's final
   collection runs (its `ResourceWarning`, if any, fails the session). Within a test, `gc.collect()` behaves as
   usual for what the test made itself.
4. A thread that is new but already stopping is waited for up to `THREAD_GRACE_S`: anyio's worker threads (and
   asyncio's executor threads) are told to stop when their event loop's root task ends, a moment before they
   actually exit. No thread is exempt by name: a pool that outlives its test is a leak of that test, and one meant
   to last the session belongs in a session-scoped fixture (rule 2).
5. A child process counts until it is reaped: one killed but never waited for (a zombie) is a leak too.
6. What a library makes once per process and keeps until the process exits is nobody's leak: libuv's signal pipe
   is made before the first test (uvloop's first loop makes it); multiprocessing's resource tracker (a process and
   its pipe, started by the first use of multiprocessing's spawn, here vLLM's) is recognised by its pid and fd.
   Descriptors a block of a test knowingly leaves to the process's exit are declared with `lives_until_exit(why)`
   (one use: vLLM in-process, tests/d3backend/test_engine_real.py); processes and threads cannot be declared so.

Linux only for descriptors and processes (read from /proc); elsewhere only threads and tasks are checked.
Loaded by tests/conftest.py; `python -m pytest -p tests._leaks` loads it anywhere.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

THREAD_GRACE_S = 2.0
PROC = Path("/proc")
_UNTIL_EXIT: set[tuple[int, str]] = set()  # descriptors declared by `lives_until_exit`


@contextmanager
def lives_until_exit(why: str) -> Iterator[None]:
    """The descriptors opened in this block and still open at its end stay open until the process exits, for the
    reason `why` (which names who keeps them): none of them is a leak of the test. Processes and threads still are.

        with lives_until_exit("vLLM keeps its first in-process engine's zmq context until exit"):
            async with EmbeddedEngine(...) as engine: ...
    """
    if not why:
        raise ValueError("lives_until_exit() needs the reason: who keeps the descriptors, and why")
    before = set(_fds())
    try:
        yield
    finally:
        _UNTIL_EXIT.update(set(_fds()) - before)


@dataclass(frozen=True)
class Snapshot:
    fds: frozenset[tuple[int, str]]  # (descriptor, what it points to)
    threads: frozenset[threading.Thread]
    processes: frozenset[tuple[int, int]]  # (pid, start time in clock ticks): a reused pid is another process
    tasks: weakref.WeakSet[asyncio.Task[object]] = field(compare=False)  # weak: a snapshot keeps no task alive

    def minus(self, other: Snapshot) -> Snapshot:
        return Snapshot(
            self.fds - other.fds,
            self.threads - other.threads,
            self.processes - other.processes,
            weakref.WeakSet(task for task in self.tasks if task not in other.tasks),
        )

    def union(self, other: Snapshot) -> Snapshot:
        tasks: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet(self.tasks)
        tasks.update(other.tasks)
        return Snapshot(self.fds | other.fds, self.threads | other.threads, self.processes | other.processes, tasks)

    def __bool__(self) -> bool:
        return bool(self.fds or self.threads or self.processes or len(self.tasks))


EMPTY = Snapshot(frozenset(), frozenset(), frozenset(), weakref.WeakSet())


def snapshot() -> Snapshot:
    return Snapshot(frozenset(_fds()), frozenset(_threads()), frozenset(_children()), weakref.WeakSet(_tasks()))


def _fds() -> Iterable[tuple[int, str]]:
    try:
        names = os.listdir(PROC / "self" / "fd")
    except OSError:  # no /proc: not Linux
        return
    for name in names:
        try:
            yield int(name), os.readlink(PROC / "self" / "fd" / name)
        except OSError:  # closed meanwhile, such as the descriptor listdir itself used
            continue


def _threads() -> Iterable[threading.Thread]:
    return (thread for thread in threading.enumerate() if thread.is_alive())


def _children() -> Iterable[tuple[int, int]]:
    me = os.getpid()
    try:
        pids = [name for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return
    for pid in pids:
        fields = _stat(pid)
        if fields is not None and int(fields[1]) == me:
            yield int(pid), int(fields[19])


def _stat(pid: str) -> list[str] | None:
    """/proc/PID/stat after the command (which may hold spaces and parentheses): state, ppid, ... (proc(5))."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:  # exited meanwhile
        return None
    return text[text.rindex(")") + 2 :].split()


def _tasks() -> Iterable[asyncio.Task[object]]:
    # asyncio's weak registry of every task: `_scheduled_tasks` on Python 3.12 and 3.13, `_all_tasks` on 3.11
    name = "_scheduled_tasks" if hasattr(asyncio.tasks, "_scheduled_tasks") else "_all_tasks"
    registry: Iterable[asyncio.Task[object]] = getattr(asyncio.tasks, name, ())
    return (task for task in list(registry) if not task.done())


class _AsyncioErrors(logging.Handler):
    """What asyncio logs about a task destroyed while pending or a transport never closed."""

    MARKERS = ("destroyed but it is pending", "Unclosed", "unclosed")

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(marker in message for marker in self.MARKERS):
            self.seen.append(message.splitlines()[0])


class LeakCheck:
    def __init__(self) -> None:
        self.owned: dict[object, Snapshot] = {}  # per wider-scoped fixture: what appeared while it was set up
        self.before: dict[str, Snapshot] = {}
        self.asyncio_errors = _AsyncioErrors()

    def owned_now(self) -> Snapshot:
        owned = EMPTY
        for part in self.owned.values():
            owned = owned.union(part)
        return owned

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[object]) -> Generator[None, object, object]:
        if fixturedef.scope == "function":
            return (yield)
        before = snapshot()
        try:
            return (yield)
        finally:
            self.owned[fixturedef] = snapshot().minus(before)

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[object]) -> None:
        self.owned.pop(fixturedef, None)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None]:
        self.before[item.nodeid] = snapshot()
        self.asyncio_errors.seen.clear()
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None]:
        try:
            return (yield)
        finally:
            before = self.before.pop(item.nodeid, None)
            if before is not None:
                self.check(item, before)

    def check(self, item: pytest.Item, before: Snapshot) -> None:
        unraisable = _collect_garbage()
        owned = self.owned_now()
        leaked = _without_process_wide(snapshot().minus(before).minus(owned))
        if leaked.threads:
            leaked = _after_stopping_threads(leaked)
        sockets = _sockets() if any(target.startswith("socket:") for _, target in leaked.fds) else {}
        if sockets:
            leaked = _without_accepted_by(owned, leaked, sockets)
        lines = [*unraisable, *self.asyncio_errors.seen, *_describe(leaked, sockets)]
        self.asyncio_errors.seen.clear()
        if lines:
            pytest.fail(
                f"{item.nodeid} left behind (after its teardown, compared with before its setup):\n  "
                + "\n  ".join(lines),
                pytrace=False,
            )


def _collect_garbage() -> list[str]:
    """`gc.collect()`, with what the collected objects' finalizers raised (an unclosed socket's `ResourceWarning`)."""
    seen: list[str] = []

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        seen.append(f"{unraisable.exc_type.__name__}: {unraisable.exc_value} (in {unraisable.object!r})")

    previous = sys.unraisablehook
    sys.unraisablehook = hook
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            gc.collect()
    finally:
        sys.unraisablehook = previous
    gc.freeze()  # what survived is out of every later collection: each check walks only the newer objects
    return seen


def _without_process_wide(leaked: Snapshot) -> Snapshot:
    """Less multiprocessing's resource tracker and its pipe (started on first use, it lasts until the interpreter
    exits: one per process, by design) and the descriptors declared by `lives_until_exit`."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    tracker = getattr(module, "_resource_tracker", None)
    pid, fd = getattr(tracker, "_pid", None), getattr(tracker, "_fd", None)
    return Snapshot(
        frozenset(entry for entry in leaked.fds if entry[0] != fd and entry not in _UNTIL_EXIT),
        leaked.threads,
        frozenset(entry for entry in leaked.processes if entry[0] != pid),
        leaked.tasks,
    )


def _without_accepted_by(owned: Snapshot, leaked: Snapshot, sockets: dict[str, _Socket]) -> Snapshot:
    """Less the connections accepted by a server of a wider-scoped fixture (a module's upstream kept alive by the
    router it serves): they are that server's, as its listening socket is. The client's end, if it is in this
    process, still counts."""
    servers = {sockets[target].port for _, target in owned.fds if target in sockets and sockets[target].listening}
    kept = frozenset(
        (fd, target) for fd, target in leaked.fds if target not in sockets or sockets[target].port not in servers
    )
    return Snapshot(kept, leaked.threads, leaked.processes, leaked.tasks)


def _after_stopping_threads(leaked: Snapshot) -> Snapshot:
    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in leaked.threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return Snapshot(leaked.fds, frozenset(t for t in leaked.threads if t.is_alive()), leaked.processes, leaked.tasks)


def _describe(leaked: Snapshot, sockets: dict[str, _Socket]) -> list[str]:
    lines = [f"fd {fd} -> {target}{sockets.get(target, '')}" for fd, target in sorted(leaked.fds)]
    lines += [f"thread {t.name!r} ({'daemon' if t.daemon else 'not daemon'})" for t in leaked.threads]
    lines += [f"process {pid} ({_state(pid)}): {_cmdline(pid)}" for pid, _ in sorted(leaked.processes)]
    lines += [f"asyncio task {task!r}" for task in leaked.tasks]
    return lines


@dataclass(frozen=True)
class _Socket:
    kind: str  # tcp, tcp6, udp, udp6, unix
    local: str
    remote: str
    listening: bool

    @property
    def port(self) -> tuple[str, str]:
        return self.kind, self.local.rpartition(":")[2]

    def __str__(self) -> str:
        return f" ({self.kind} {self.local} -> {self.remote})" if self.remote else f" ({self.kind} {self.local})"


def _sockets() -> dict[str, _Socket]:
    """`socket:[inode]` -> where it is bound and connected, from /proc/net (proc(5))."""
    found: dict[str, _Socket] = {}
    for kind in ("tcp", "tcp6", "udp", "udp6"):
        try:
            rows = (PROC / "net" / kind).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()  # sl, local, remote, state (0A: LISTEN), ..., inode
            found[f"socket:[{cols[9]}]"] = _Socket(kind, _address(cols[1]), _address(cols[2]), cols[3] == "0A")
    try:
        rows = (PROC / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        rows = []
    for row in rows:
        cols = row.split()  # num, refcount, protocol, flags, type, state, inode, path
        found[f"socket:[{cols[6]}]"] = _Socket("unix", cols[7] if len(cols) > 7 else "unnamed", "", False)
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return f"{'.'.join(str(b) for b in raw[::-1])}:{int(port, 16)}"
    words = [raw[i : i + 4][::-1].hex() for i in range(0, 16, 4)]  # four host-order 32-bit words
    return f"[{':'.join(w[j : j + 4] for w in words for j in (0, 4))}]:{int(port, 16)}"


def _state(pid: int) -> str:
    fields = _stat(str(pid))
    if fields is None:
        return "exited"
    return "exited, never waited for" if fields[0] == "Z" else "running"


def _cmdline(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or "?"


def _make_process_wide_singletons() -> None:
    """Make now what a library makes once per process, on first use, and keeps until the process exits: it is
    then in every test's first snapshot, not a leak of whichever test happened to run first."""
    try:
        import uvloop
    except ImportError:
        return
    uvloop.new_event_loop().close()  # libuv's signal-lock pipe, made by the first loop (uv__signal_global_once_init)


def pytest_configure(config: pytest.Config) -> None:
    _make_process_wide_singletons()
    check = LeakCheck()
    config.pluginmanager.register(check, "d3-leak-check")
    logging.getLogger("asyncio").addHandler(check.asyncio_errors)
    config.add_cleanup(lambda: logging.getLogger("asyncio").removeHandler(check.asyncio_errors))


def pytest_sessionfinish() -> None:
    gc.unfreeze()  # before pytest's own last collection (at unconfigure), which then sees the whole heap again
