"""Errors of the decision engines.

    EngineError
     ├── EngineUnavailable    no engine answered: connection refused, the engine died, 5xx, overloaded
     ├── EngineTimeout        the engine did not answer in time
     ├── EngineRejected       the engine refused the request (4xx, or 501): `status` and its `message`
     └── EngineBadResponse    the engine answered 200 with something that is not a valid decision

Callers that only need "the engine could not decide" catch `EngineError`.
"""

from __future__ import annotations


class EngineError(Exception):
    """Root of the errors raised by decision engines."""


class EngineUnavailable(EngineError):
    """No engine could be reached or every one failed (connection errors, 5xx, overload)."""


class EngineTimeout(EngineError):
    """The engine did not answer within the configured timeout."""


class EngineRejected(EngineError):
    """The engine refused the request; `status` is its HTTP status and `message` its explanation."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"the engine refused the request ({status}): {message}")


class EngineBadResponse(EngineError):
    """The engine's 200 answer is not a valid decision for the questions asked."""
