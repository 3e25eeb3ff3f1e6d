"""Errors of the decision engines.

    EngineError
     ├── EngineUnavailable    no engine answered: connection refused, the engine died, 5xx, overloaded
     ├── EngineTimeout        the engine did not answer in time
     ├── EngineRejected       the engine refused the request (4xx, or 501): `status` and its `message`
     │    └── EngineRateLimited  429 from a Decisions engine (`retry_after_s` when it said), not retried
     └── EngineBadResponse    the engine answered 200 with something that is not a valid decision
          └── EngineBadAnswer  one question's answer breaks the contract: missing, mistyped, or a confidence or
               │               probability that is missing, not finite, or outside 0..1 (`question`, `field`)
               └── EngineRefused  a Decisions engine refused to answer questions (`refused`; the others' `answers`)

Callers that only need "the engine could not decide" catch `EngineError`. The router counts failures by class
name (`d3router_engine_errors_total{kind="EngineBadAnswer"}`), so each class is a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from d3backend._types import Answer, Usage


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


class EngineRateLimited(EngineRejected):
    """A Decisions engine answered 429; `retry_after_s` is its `Retry-After` in seconds, when it gave one."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(429, message)


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


class EngineRefused(EngineBadAnswer):
    """A Decisions engine answered `type: refusal` for the questions in `refused` (the first is `question`): they are
    unanswered, so the decision fails whole and the policy's `on_engine_error` applies (docs/decisions.md).
    `answers` holds the other questions' answers and `usage` the call's tokens, for a caller that can use them
    (the router's own `/v1/decisions` answers the refusals as refusals); `engine` the pool's engine that refused
    (`FailoverEngine`), empty from an engine alone."""

    def __init__(self, refused: tuple[str, ...], answers: Mapping[str, Answer], usage: Usage) -> None:
        self.refused = refused
        self.answers = answers
        self.usage = usage
        self.engine = ""
        names = ", ".join(map(repr, refused))
        super().__init__(
            refused[0], "type", f"the engine refused to answer {names}; the policy's on_engine_error applies"
        )
