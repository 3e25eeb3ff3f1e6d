"""The decision log off the request path: a request puts its line on a bounded queue and goes on; one writer thread
appends the lines to the file.

    log = DecisionLog.open(path, metrics)      # opens (or creates) the file now: a bad path fails here, not later
    log.write(line)                            # never blocks, never raises: a full queue drops the line, counted
    log.reopen()                               # SIGHUP, after logrotate moved the file: the next lines go to a new one
    log.close()                                # every queued line written first

A full disk, a removed folder or any other write error never fails a request: the lines are dropped and counted
(`d3router_decision_log_dropped_total{reason="full|error"}`), and one warning is logged per `WARN_EVERY_S`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path
from typing import TextIO

from router._observe.metrics import Counts, Metrics

logger = logging.getLogger(__name__)

MAX_QUEUED = 10_000  # lines waiting for the writer; about 10 MB at most, a few seconds of a busy router's lines
WARN_EVERY_S = 60.0
_REOPEN = "\0reopen"  # a queue item, not a line: every line ends with a newline


class DecisionLog:
    """A JSON-lines file written by its own thread. `write` is safe from any thread; `close` is idempotent."""

    def __init__(self, path: Path, file: TextIO, metrics: Metrics, max_queued: int = MAX_QUEUED) -> None:
        self.dropped: Counts[str] = metrics.decision_log_dropped
        self.path = path
        self._file: TextIO | None = file
        self._queue: collections.deque[str | threading.Event] = collections.deque()
        self._max = max_queued
        self._wake = threading.Condition()
        self._closing = False
        self._warned_at = -WARN_EVERY_S
        self._thread = threading.Thread(target=self._run, name="d3-decision-log", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, path: Path, metrics: Metrics, max_queued: int = MAX_QUEUED) -> DecisionLog:
        """Open `path` for appending (its folder made if missing); `OSError` if it cannot be."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(path, open(path, "a", encoding="utf-8"), metrics, max_queued)

    @property
    def name(self) -> str:
        return str(self.path)

    def write(self, line: str) -> None:
        """Queue one line (with its newline) for the writer; dropped and counted when the queue is full or closed."""
        with self._wake:
            if self._closing or len(self._queue) >= self._max:
                self._drop("full", 1)
                return
            self._queue.append(line)
            self._wake.notify()

    def reopen(self) -> None:
        """Write the lines queued from now on to a file opened anew at `path` (log rotation moved the old one)."""
        with self._wake:
            self._queue.append(_REOPEN)  # in order: the lines before it go to the old file
            self._wake.notify()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every line queued before this call is written (or dropped); False if `timeout_s` passed."""
        done = threading.Event()
        with self._wake:
            if self._closing:
                return True
            self._queue.append(done)  # in order, as a reopen is
            self._wake.notify()
        return done.wait(timeout_s)

    def close(self) -> None:
        """Write every queued line, then close the file and end the thread."""
        with self._wake:
            if self._closing and not self._thread.is_alive():
                return
            self._closing = True
            self._wake.notify()
        self._thread.join()

    # --- the writer thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait()
                items = list(self._queue)
                self._queue.clear()
                closing = self._closing
            lines: list[str] = []
            for item in items:
                if isinstance(item, threading.Event):  # a flush: the lines before it are written first
                    if lines:
                        self._append(lines)
                    lines = []
                    item.set()
                elif item is _REOPEN:
                    if lines:
                        self._append(lines)
                    lines = []
                    self._close_file()
                    self._open_file()
                else:
                    lines.append(item)
            if lines:
                self._append(lines)
            if closing:
                self._close_file()
                return

    def _append(self, lines: list[str]) -> None:
        if self._file is None:
            self._open_file()
        if self._file is None:
            self._drop("error", len(lines))
            return
        try:
            self._file.write("".join(lines))
            self._file.flush()
        except (OSError, ValueError) as exc:  # ValueError: a file closed under us
            self._drop("error", len(lines), exc)
            self._close_file()  # the next batch opens it again: a disk with room again takes lines again

    def _open_file(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            self._file = None
            self._drop("error", 0, exc)

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError as exc:  # the flush in close found the disk full: those lines are lost
                self._drop("error", 0, exc)

    def _drop(self, reason: str, count: int, exc: BaseException | None = None) -> None:
        if count:
            self.dropped[reason] += count
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            why = "its queue is full" if reason == "full" else f"it cannot be written ({exc or 'unknown error'})"
            logger.warning("decision log %s: lines are dropped, %s; requests are not affected (counted in "
                           "d3router_decision_log_dropped_total)", self.path, why)  # fmt: skip
