"""Errors of the decision engines.

    EngineError
     ├── EngineUnavailable    no engine answered: connection refused, the engine died, 5xx, overloaded
     ├── EngineTimeout        the engine did not answer in time
     ├── EngineRejected       the engine refused the request (4xx, or 501): `status` and its `message`
     └── EngineBadResponse    the engine answered 200 with something that is not a valid decision
          └── EngineBadAnswer  one question's answer breaks the contract: missing, mistyped, or a confidence or
                               probability that is missing, not finite, or outside 0..1 (`question`, `field`)

Callers that only need "the engine could not decide" catch `EngineError`. The router counts failures by class
name (`d3router_engine_errors_total{kind="EngineBadAnswer"}`), so each class is a reason.
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


class EngineBadAnswer(EngineBadResponse):
    """One question's answer breaks the `/v1/systemone` contract; `question` and `field` (e.g. `confidence`,
    `probabilities.code`, empty for the whole answer) say where. Never read as a default value: a guard must not
    pass a request because its answer was unreadable (issue 19.9)."""

    def __init__(self, question: str, field: str, message: str) -> None:
        self.question = question
        self.field = field
        super().__init__(message)
