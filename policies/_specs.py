"""The configuration's questions and rules: what a policy asks the engine and what its rules do (pydantic models at
the trust boundary, strict about unknown keys; compiled by `_load.py`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from d3backend import MAX_SCORE_LEVELS, MIN_SCORE_LEVELS
from policies._params import STRUCTURAL
from policies._strict import HEADER_NAME, Strict

_RESERVED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "authorization",
        "cookie",
        "set-cookie",
    }
)
_QUESTION_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- questions ------------------------------------------------------------------------------------------------
class ChoiceSpec(Strict):
    """A question with named options; `when` reads the pick and each option's probability."""

    type: Literal["choice"]
    instructions: str | None = Field(None, description="The question put to the engine.")
    criteria: dict[str, str | None] = Field(description="Option name -> description (or null), in order.")

    @field_validator("criteria", mode="before")
    @classmethod
    def _names(cls, criteria: Any) -> Any:
        if isinstance(criteria, dict):
            for name in criteria:
                if not isinstance(name, str) or not name.strip():
                    raise PydanticCustomError(
                        "option_name",
                        "option names must be non-empty strings, found {name}{hint}",
                        {"name": repr(name), "hint": "; quote it" if isinstance(name, bool | int | float) else ""},
                    )
            if len(criteria) < 2:
                raise PydanticCustomError(
                    "options", "a choice needs at least 2 options, found {n}", {"n": len(criteria)}
                )
        return criteria


class NoulCriteria(Strict):
    """What a yes and a no mean, for the engine."""

    true: str | None = Field(None, description="What yes means.")
    false: str | None = Field(None, description="What no means.")

    @model_validator(mode="before")
    @classmethod
    def _bool_keys(cls, data: Any) -> Any:
        # YAML reads the unquoted keys `true`/`false` as booleans.
        if isinstance(data, dict):
            return {str(k).lower() if isinstance(k, bool) else k: v for k, v in data.items()}
        return data


class NoulSpec(Strict):
    """A yes/no question; `when` reads P(yes)."""

    type: Literal["noul"]
    instructions: str | None = Field(None, description="The question put to the engine.")
    criteria: NoulCriteria | None = None


class ScoreSpec(Strict):
    """A question answered on ordered levels; `when` reads the expected level, 0-based."""

    type: Literal["score"]
    instructions: str | None = Field(None, description="The question put to the engine.")
    criteria: list[str] = Field(
        min_length=MIN_SCORE_LEVELS, max_length=MAX_SCORE_LEVELS, description="Level names, lowest first."
    )

    @field_validator("criteria")
    @classmethod
    def _levels(cls, levels: list[str]) -> list[str]:
        for level in levels:
            if not level.strip():
                raise PydanticCustomError("level", "score levels must be non-empty")
        duplicates = sorted({level for level in levels if levels.count(level) > 1})
        if duplicates:
            raise PydanticCustomError(
                "level", "score levels must be unique; repeated: {d}", {"d": ", ".join(map(repr, duplicates))}
            )
        return levels


QuestionSpec = Annotated[ChoiceSpec | NoulSpec | ScoreSpec, Field(discriminator="type")]


# --- rules ----------------------------------------------------------------------------------------------------
class BlockSpec(Strict):
    """An error answered in the API's own shape, before any upstream is called."""

    status: int = Field(403, ge=400, le=499, description="A 4xx status.")
    message: str = Field("Refused by policy.", min_length=1, description="The error's message.")
    as_answer: bool = Field(
        False,
        description="Answer as the model would instead of an error: a normal assistant answer saying `message` "
        "(status 200, streamed when the request streams, with a stop reason), which coding agents show once and end "
        "their turn on, never retrying. The response's x-d3-action still says block.",
    )


class EngineErrorBlockSpec(BlockSpec):
    """An error answered when the engine cannot decide."""

    status: int = Field(503, ge=400, le=599, description="A 4xx or 5xx status; 503 says the guard is unavailable.")


Tags = dict[str, str]
Params = dict[str, Any]


def _checked_tags(tags: Tags) -> Tags:
    """Tags are headers: a valid name, not one the router owns, no control character in the value."""
    for name, value in tags.items():
        if not HEADER_NAME.match(name):
            raise PydanticCustomError("header", "invalid header name {n}", {"n": repr(name)})
        lowered = name.lower()
        if lowered in _RESERVED_HEADERS or lowered.startswith("x-d3-"):
            raise PydanticCustomError(
                "header", "header {n} is reserved; pick another name, e.g. 'x-team'", {"n": repr(name)}
            )
        if any(ch in value for ch in "\r\n\0") or not value.isprintable():
            raise PydanticCustomError("header", "the value of header {n} holds a control character", {"n": repr(name)})
    return tags


class ActionSpec(Strict):
    """What a rule does: route (an upstream or a fallback list), block, and optionally tag and set."""

    route: str | list[str] | None = Field(None, description="An upstream name, or a list tried in order.")
    block: BlockSpec | None = Field(None, description="Refuse the request with this error instead of routing it.")
    tag: Tags = Field(default_factory=dict, description="Headers added upstream and to the response.")
    set_: Params = Field(default_factory=dict, alias="set", description="Request parameters to set.")

    @field_validator("route")
    @classmethod
    def _route(cls, route: str | list[str] | None) -> str | list[str] | None:
        if isinstance(route, list):
            if not route:
                raise PydanticCustomError("route", "a route list needs at least one upstream")
            if len(set(route)) != len(route):
                raise PydanticCustomError("route", "a route list names an upstream twice")
        return route

    @field_validator("tag")
    @classmethod
    def _tags(cls, tags: Tags) -> Tags:
        return _checked_tags(tags)

    @field_validator("set_")
    @classmethod
    def _params(cls, params: Params) -> Params:
        for name in params:
            if name in STRUCTURAL:
                raise PydanticCustomError(
                    "param",
                    "`set` cannot change {n}: `route` picks the model and the client owns the rest",
                    {"n": repr(name)},
                )
        return params

    @model_validator(mode="after")
    def _route_or_block(self) -> ActionSpec:
        if self.route is not None and self.block is not None:
            raise PydanticCustomError("action", "a rule either routes or blocks, not both")
        return self


class EngineErrorSpec(ActionSpec):
    """What a policy does when the engine cannot answer."""

    block: EngineErrorBlockSpec | None = Field(None, description="Refuse the request with this error instead.")


class RuleSpec(ActionSpec):
    """One rule; rules run in order, and the first that routes or blocks ends the walk."""

    name: str = Field(min_length=1, description="Unique in its policy; named in x-d3-rule, metrics and logs.")
    when: str | None = Field(
        None, description='A condition over the answers, e.g. kind == "code" and difficulty >= 1.5'
    )

    @field_validator("when", mode="before")
    @classmethod
    def _when(cls, when: Any) -> Any:
        if isinstance(when, bool | int | float):
            shown = str(when).lower() if isinstance(when, bool) else repr(when)
            raise PydanticCustomError("when", "`when` takes a condition as text, found {v}; quote it", {"v": shown})
        return when

    @model_validator(mode="after")
    def _does_something(self) -> RuleSpec:
        if self.route is None and self.block is None and not self.tag and not self.set_:
            raise PydanticCustomError(
                "action", "rule {n} does nothing; give it `route`, `block`, `tag` or `set`", {"n": repr(self.name)}
            )
        return self


class StateSpec(Strict):
    """What the engine reads of the request: the decision state."""

    from_: Literal["last_user", "new", "conversation", "json"] = Field(
        "last_user",
        alias="from",
        description="What the engine reads: the last user turn; what is new since the assistant last spoke (its tool "
        "calls, then the user's words and tool results after them: for agents); a transcript; or JSON.",
    )
    max_chars: int = Field(6000, gt=0, description="State budget; oldest text is cut first, and said so.")


class SessionSpec(Strict):
    """How a conversation's later turns are routed (the session is found by server.sessions)."""

    mode: Literal["sticky", "escalate", "off"] = Field(
        "sticky",
        description="`sticky`: later turns keep the upstreams the session's first routed turn chose. `escalate`: a "
        "later turn may move to an upstream of a higher `tier` (upstreams.NAME.tier, higher is stronger), never "
        "back. `off`: every turn is decided alone. Block rules are evaluated on every turn in every mode.",
    )
    ttl_s: float = Field(3600.0, gt=0, description="A session is forgotten this long after its last turn.")


class OverlapSpec(Strict):
    """The upstream request started while the engine decides (issue 31), on the route the decision is expected to
    take; nothing reaches the client before the decision, and a decision that differs cancels it."""

    when: Literal["always", "sticky", "agreeing"] = Field(
        "always",
        description="`always`: every decided request. `sticky`: only a session's later turns, on the session's route. "
        "`agreeing`: only a session's turns whose last `agreed` decisions took the route expected of them.",
    )
    route: str | None = Field(
        None,
        description="The upstream to start on when the session has no route yet; unset: the policy's default route. "
        "A session's route always comes first.",
    )
    agreed: int = Field(2, ge=1, le=100, description="With `when: agreeing`: how many decisions in a row must agree.")


class ExpectSpec(Strict):
    """What a test case checks; only the keys given are checked."""

    rule: str | None = Field(None, description="The rule that decides.")
    route: str | list[str] | None = Field(None, description="A name checks the first upstream, a list the whole list.")
    block: bool | int | None = Field(None, description="true or false, or the expected status.")
    tags: Tags | None = Field(None, description="Tags the decision adds (the ones given).")
    set_: Params | None = Field(None, alias="set", description="Parameters the decision sets (the ones given).")
    degraded: bool | None = Field(None, description="Whether on_engine_error decided.")


class TestCaseSpec(Strict):
    """A policy test case, run by `d3router test`: answers in, a decision expected."""

    name: str | None = Field(None, description="Shown beside the case's number in `d3router test`'s output.")
    answers: dict[str, Any] = Field(
        default_factory=dict,
        description="Per question: a number for a noul (P(yes)) or a score (expected level), an option name "
        "for a choice, or a mapping of probabilities.",
    )
    facts: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Per fact the rules read (e.g. `request.tokens: 150000`): its value for this case.",
    )
    engine_error: bool = Field(False, description="Test what happens when the engine fails.")
    expect: ExpectSpec = Field(description="What the decision must be.")
