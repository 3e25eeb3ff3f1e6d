"""Typed questions and answers, mirroring the `/v1/systemone` wire format.

A question is one of `Choice`, `Noul` (yes/no) or `Score` (an ordered scale). The engine answers each with a
probability for every option; the answer types keep those probabilities and the engine's summary value:

    >>> kind = Choice("What kind of work is this?", {"code": "Writing or fixing code", "chat": None})
    >>> kind.to_wire()["criteria"]
    {'code': 'Writing or fixing code', 'chat': None}

Limits are those of Decision 3.0 (see SYSTEMONE.md); generative models served by vLLM label choices A..Z, so
they take at most `GENERATIVE_MAX_OPTIONS` options.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

MAX_QUESTIONS = 64
D3_MAX_OPTIONS = 255
GENERATIVE_MAX_OPTIONS = 26
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10


def _digest(wire: dict[str, Any]) -> bytes:
    """The question's content as 16 bytes, computed once: the answer cache keys by it (issue 19.11)."""
    text = json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Choice:
    """Pick one option. `options` maps each option name to a description or `None`, in order; the question keeps
    its own copy, so changing the mapping it was built from afterwards changes nothing."""

    instructions: str | None
    options: Mapping[str, str | None]
    type: Literal["choice"] = field(default="choice", init=False)
    digest: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", dict(self.options))
        object.__setattr__(self, "digest", _digest(self.to_wire()))

    def to_wire(self) -> dict[str, Any]:
        return {"type": "choice", "instructions": self.instructions, "criteria": dict(self.options)}


@dataclass(frozen=True, slots=True)
class Noul:
    """Yes or no. `yes` and `no` optionally describe what each answer means."""

    instructions: str | None
    yes: str | None = None
    no: str | None = None
    type: Literal["noul"] = field(default="noul", init=False)
    digest: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", _digest(self.to_wire()))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"type": "noul", "instructions": self.instructions}
        if self.yes is not None or self.no is not None:
            wire["criteria"] = {"true": self.yes, "false": self.no}
        return wire


@dataclass(frozen=True, slots=True)
class Score:
    """A level on an ordered scale; `levels` names them from first (0) to last."""

    instructions: str | None
    levels: tuple[str, ...]
    type: Literal["score"] = field(default="score", init=False)
    digest: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "digest", _digest(self.to_wire()))

    def to_wire(self) -> dict[str, Any]:
        return {"type": "score", "instructions": self.instructions, "criteria": list(self.levels)}


Question = Choice | Noul | Score


@dataclass(frozen=True, slots=True)
class ChoiceAnswer:
    """The picked option, each option's probability, and the pick's confidence."""

    choice: str
    probabilities: Mapping[str, float]
    confidence: float
    type: Literal["choice"] = field(default="choice", init=False)


@dataclass(frozen=True, slots=True)
class NoulAnswer:
    """`noul` is P(yes); `probabilities` holds `yes` and `no`."""

    noul: float
    confidence: float
    type: Literal["noul"] = field(default="noul", init=False)

    @property
    def probabilities(self) -> Mapping[str, float]:
        return {"yes": self.noul, "no": 1.0 - self.noul}


@dataclass(frozen=True, slots=True)
class ScoreAnswer:
    """`score` is the expected level (0-based, a float); `probabilities[i]` is that of `legend[i]`."""

    score: float
    legend: tuple[str, ...]
    probabilities: tuple[float, ...]
    confidence: float
    type: Literal["score"] = field(default="score", init=False)


Answer = ChoiceAnswer | NoulAnswer | ScoreAnswer


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens an engine call read and wrote; `cached_tokens` are input tokens a hosted model read from its prompt
    cache (a Decisions engine's `input_tokens_details.cached_tokens`; d3 on vLLM has no prefix cache: 0)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


class Decided(NamedTuple):
    """What an engine returns for one `decide` call: an answer per question, in the order asked.

    `engine` names the engine of a pool (`FailoverEngine`) that answered. A named tuple: immutable like the frozen
    dataclasses here, and 6x cheaper to build on the cache's hot path.
    """

    answers: Mapping[str, Answer]
    model: str
    usage: Usage = Usage()
    elapsed_ms: float = 0.0
    cached: bool = False
    engine: str = ""  # the pool's engine that answered (`FailoverEngine`); empty from an engine alone
