"""`FakeEngine`: answers from a table, for tests and benchmarks, with an optional delay or error.

    engine = FakeEngine({"jailbreak": 0.97, "kind": "code"}, delay_s=0.01)

Each call is recorded in `calls` (the state and what was asked); `keep_calls=N` keeps only the last N, for a fake
serving a long run (the soak's router, `benchmarks/_proxy.py`): kept whole, the record held every request's state,
about 240 bytes a request, and was the soak's RSS growth (docs/operations.md, Load). Values use `answer_from`'s
shorthand. A question the table does not name gets a neutral answer: a choice's first
option, a noul's "no", a score's first level. `answers` may also be a function of the state and the questions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from d3backend._answers import answer_from
from d3backend._errors import EngineError
from d3backend._protocol import Closing
from d3backend._types import Answer, Choice, Decided, Noul, Question, Usage
from d3backend._wire import JSONValue

Table = Mapping[str, Any]


class FakeEngine(Closing):
    """A decision engine that answers from `answers` after `delay_s`, or raises `error`."""

    def __init__(
        self,
        answers: Table | Callable[[JSONValue, Mapping[str, Question]], Table] | None = None,
        *,
        delay_s: float = 0.0,
        error: EngineError | None = None,
        model: str = "fake",
        keep_calls: int | None = None,
    ) -> None:
        self.answers = answers or {}
        self.delay_s = delay_s
        self.error = error
        self.model = model
        self.keep_calls = keep_calls
        self.calls: list[tuple[JSONValue, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = []
        self.closed = False

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        if self.keep_calls != 0:
            self.calls.append((state, tuple(questions), tuple(images), tuple(videos)))
            if self.keep_calls is not None and len(self.calls) > self.keep_calls:
                del self.calls[0]
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        table = self.answers(state, questions) if callable(self.answers) else self.answers
        answers: dict[str, Answer] = {}
        for qid, question in questions.items():
            value = table.get(qid, _neutral(question))
            answers[qid] = answer_from(question, value)
        return Decided(answers, self.model, Usage(0, 0), self.delay_s * 1000.0)

    async def probe(self) -> Decided:
        return await self.decide("probe", {"ready": Noul(None)})

    async def aclose(self) -> None:
        self.closed = True


def _neutral(question: Question) -> Any:
    if isinstance(question, Choice):
        return next(iter(question.options))
    if isinstance(question, Noul):
        return 0.0
    return 0
