"""Facts: what the router knows of a request without asking the engine, readable in `when` like answers.

    request.tokens > 100000                    the input's size in tokens (an estimate, see `estimate_tokens`)
    request.images > 0 or request.stream       counts are numbers, flags are conditions
    request.api == "responses"                 the client API (checked against the four names)
    caller.group == "batch"                    the client key's name and group (empty without server.auth)

Each fact has a type, checked when the policy loads as a question's is; a rule that reads only facts needs no
engine call, and a policy whose walk ends on facts asks the engine nothing (`Policy.walk`). The router computes
them per request (router/_apis/facts.py); a library caller passes them to `Policy.evaluate(answers, facts)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from policies._params import APIS

FactValue = bool | int | float | str
Facts = Mapping[str, FactValue]
FactType = Literal["number", "string", "bool"]
SCOPES = ("request", "caller", "session", "budget")


@dataclass(frozen=True, slots=True)
class Fact:
    """One fact's name (`scope.attr`), its type, the values a string takes (None: any) and what it is."""

    name: str
    type: FactType
    doc: str
    options: tuple[str, ...] | None = None


FACTS: Mapping[str, Fact] = {
    fact.name: fact
    for fact in (
        Fact("request.tokens", "number", "The input's size in tokens, estimated from its characters (chars/4, "
             "non-ASCII text counted denser), 4 a turn added; 8% under Qwen2.5's count on prose, 2% over on code."),
        Fact("request.chars", "number", "Characters of the conversation's text: every turn, tool calls and results."),
        Fact("request.turns", "number", "User turns in the request (a Completions prompt is one)."),
        Fact("request.tools", "number", "Tools the request offers the model (`tools`)."),
        Fact("request.images", "number", "Images in the request's content parts, every turn."),
        Fact("request.videos", "number", "Videos in the request's content parts, every turn."),
        Fact("request.stream", "bool", "Whether the client asked for a streamed answer."),
        Fact("request.api", "string", "The client API the request came on.", tuple(APIS)),
        Fact("caller.name", "string", "The client key's name (server.auth); empty without keys."),
        Fact("caller.group", "string", "The client key's group; empty without keys or for a key with none."),
        Fact("budget.used", "number", "The share used of the caller's most used budget (its key's or group's, "
             "server.auth): 0 to 1 (0.8: 80%), 0 without one; read once as the request arrives."),
        Fact("session.turns", "number", "Assistant turns the conversation has had before this one (as sent)."),
    )
}  # fmt: skip

_TYPE_WORDS = {"number": "a number", "string": "a string", "bool": "true or false"}


def fact_type_error(name: str, value: object) -> str | None:
    """Why `value` cannot be the fact `name` (unknown, or of another type), or None: for test cases' `facts`."""
    fact = FACTS.get(name)
    if fact is None:
        return f"unknown fact {name!r}; expected one of {', '.join(map(repr, FACTS))}"
    ok = {
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "bool": isinstance(value, bool),
    }[fact.type]
    if not ok:
        return f"fact {name!r} is {_TYPE_WORDS[fact.type]}, found {value!r}"
    if fact.options is not None and value not in fact.options:
        return f"fact {name!r} is one of {', '.join(map(repr, fact.options))}, found {value!r}"
    return None
