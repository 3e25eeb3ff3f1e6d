"""Admission: a bound on the requests one process serves at once and on the request-body bytes it holds, so that a
burst is answered 503 with `Retry-After` (in the API's own shape) before the process runs out of memory.

    admission = Admission(max_requests=512, max_bytes=256 * 2**20)   # server.max_concurrent_requests, ...
    ticket = admission.enter()             # None: at the request limit -> 503
    with ticket:                           # the body's bytes are reserved as they arrive (read_body), all
        ...                                # released when the request ends

A body's bytes are counted as they arrive (`read_body` reserves them through the ticket current in its context),
so a thousand clients each sending 4 MiB hold at most `max_bytes` of it, not 4 GiB.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType

from router._errors import Overloaded

FULL = "the router serves as many requests as it may (server.max_concurrent_requests); retry shortly"
CURRENT: ContextVar[Ticket | None] = ContextVar("d3_admission", default=None)


class Admission:
    """The limits of one process, shared by its requests (one event loop: no lock needed)."""

    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self.requests = 0
        self.bytes = 0

    def enter(self) -> Ticket | None:
        """A ticket for one more request, or None when `max_requests` are in flight."""
        if self.requests >= self.max_requests:
            return None
        self.requests += 1
        return Ticket(self)


class Ticket:
    """One request's share: the body bytes it holds. Made current for its `with` block."""

    __slots__ = ("_admission", "_token", "held")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.held = 0
        self._token: Token[Ticket | None] | None = None

    def reserve(self, size: int) -> None:
        """Hold `size` more bytes; `Overloaded` (503) when the process holds `max_bytes` already."""
        admission = self._admission
        if admission.bytes + size > admission.max_bytes:
            raise Overloaded(
                "the router holds as many request bodies as it may (server.max_buffered_bytes); retry shortly"
            )
        admission.bytes += size
        self.held += size

    def __enter__(self) -> Ticket:
        self._token = CURRENT.set(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            CURRENT.reset(self._token)
        admission = self._admission
        admission.bytes -= self.held
        admission.requests -= 1
        self.held = 0


def reserve(size: int) -> None:
    """Reserve `size` body bytes for the request in this context (nothing outside an admitted request)."""
    ticket = CURRENT.get()
    if ticket is not None:
        ticket.reserve(size)
