"""The `DecisionEngine` protocol every engine implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from d3backend._types import Decided, Question
from d3backend._wire import JSONValue


@runtime_checkable
class DecisionEngine(Protocol):
    """Answers typed questions about a state in one call.

    async with engine:
        decided = await engine.decide("Fix this SQL query", questions)
    """

    async def decide(
        self,
        state: JSONValue,
        questions: Mapping[str, Question],
        *,
        images: Sequence[str] = (),
        videos: Sequence[str] = (),
    ) -> Decided:
        """Ask every question about `state`; raise an `EngineError` when the engine cannot answer."""
        ...

    async def aclose(self) -> None:
        """Release what the engine holds (clients, processes); the engine cannot be used afterwards."""
        ...


class Closing:
    """`async with` for anything with `aclose()`: the engines here share it."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
