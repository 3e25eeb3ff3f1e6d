"""A local OpenAI Decisions API server for tests, checked by the `openai` SDK's own types both ways.

    app = DecisionsServer({"jailbreak": 0.9, "kind": "code", "difficulty": "refuse"})
    # POST /v1/decisions: the request must conform to openai.types.DecisionCreateParams (unknown keys refused);
    # each question is answered from the table by its name (`answer_from`'s descriptions, "refuse" for a refusal,
    # uniform when absent); the answer is parsed by openai.types.Decision before it is sent.

`conforms(value, DecisionCreateParams)` is the strict check: pydantic's TypeAdapter over the SDK's TypedDicts
ignores unknown keys and validates `Iterable` fields lazily, so it would pass a misspelt field; this walks the
TypedDicts' own annotations (required keys, no others, literals, unions) instead, and runs the TypeAdapter too.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

from openai.types import Decision, DecisionCreateParams
from pydantic import TypeAdapter
from starlette.types import Receive, Scope, Send
from typing_extensions import is_typeddict

from d3backend import (
    Answer,
    Choice,
    ChoiceAnswer,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    Usage,
    answer_from,
    answer_item,
    usage_json,
)
from policies import Config, Policy, PolicyTest

_PARAMS = TypeAdapter(DecisionCreateParams)
SERVED_USAGE = Usage(120, 0, 100)  # 100 of the 120 input tokens from the prompt cache


class NonConforming(ValueError):
    """A value that the SDK's types do not allow; the message names where."""


def conforms(value: Any, tp: Any, path: str = "body") -> None:
    """Raise `NonConforming` unless `value` (plain JSON) is allowed by the SDK type `tp`."""
    origin = get_origin(tp)
    if tp is object or tp is Any:
        return
    if origin in (Required, NotRequired) or origin is typing.Annotated:
        conforms(value, get_args(tp)[0], path)
        return
    if is_typeddict(tp):
        if not isinstance(value, dict):
            raise NonConforming(f"{path}: expected an object ({tp.__name__}), found {value!r}")
        hints = get_type_hints(tp, include_extras=True)
        unknown = sorted(set(value) - set(hints))
        if unknown:
            raise NonConforming(f"{path}: unknown keys {unknown} for {tp.__name__}")
        # Not `__required_keys__`: the SDK's modules use `from __future__ import annotations`, so `Required[...]` is a
        # string when the class is made, and a `total=False` TypedDict then lists no required key at all.
        required = {
            key for key, hint in hints.items()
            if get_origin(hint) is Required or (tp.__total__ and get_origin(hint) is not NotRequired)
        }  # fmt: skip
        missing = sorted(required - set(value))
        if missing:
            raise NonConforming(f"{path}: missing {missing} of {tp.__name__}")
        for key, item in value.items():
            conforms(item, hints[key], f"{path}.{key}")
        return
    if origin in (Union, types.UnionType):
        problems = []
        for option in get_args(tp):
            try:
                conforms(value, option, path)
                return
            except NonConforming as exc:
                problems.append(str(exc))
        raise NonConforming(f"{path}: none of the allowed shapes: {'; '.join(problems)}")
    if origin is Literal:
        if not any(value == allowed and type(value) is type(allowed) for allowed in get_args(tp)):
            raise NonConforming(f"{path}: expected one of {get_args(tp)}, found {value!r}")
        return
    if origin in (list, Iterable, typing.Iterable) or origin is getattr(typing, "Sequence", None):
        if not isinstance(value, list):
            raise NonConforming(f"{path}: expected an array, found {value!r}")
        for index, item in enumerate(value):
            conforms(item, get_args(tp)[0], f"{path}[{index}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise NonConforming(f"{path}: expected an object, found {value!r}")
        for key, item in value.items():
            conforms(item, get_args(tp)[1], f"{path}.{key}")
        return
    if tp is type(None):
        ok = value is None
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise NonConforming(f"{path}: the checker does not know the type {tp!r}")
    if not ok:
        raise NonConforming(f"{path}: expected {tp.__name__}, found {value!r}")


def check_request(body: Any) -> None:
    """`body` is a request `client.decisions.create` could have sent: strictly (`conforms`), and by pydantic."""
    conforms(body, DecisionCreateParams)
    _PARAMS.validate_python(body)


def question_of(param: Mapping[str, Any]) -> Question:
    """The d3backend question a `questions[]` item asks (only what the table's answers need)."""
    if param["type"] == "predicate":
        return Noul(None)
    if param["type"] == "choice":
        return Choice(None, {str(item["value"]): None for item in param["choices"]})
    return Score(None, tuple(level["label"] for level in param["levels"]))


class DecisionsServer:
    """An ASGI app answering `POST /v1/decisions` from `table` (question name -> an answer, an `answer_from` value,
    or "refuse").
    `requests` keeps every request body; `status` and `error` make it answer an error instead."""

    def __init__(self, table: Mapping[str, Any], *, model: str = "luna-test", usage: Usage = SERVED_USAGE) -> None:
        self.table = dict(table)
        self.model = model
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        self.status = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        more = True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        if (scope["method"], scope["path"]) != ("POST", "/v1/decisions"):
            await _send(send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        body = json.loads(raw)
        self.requests.append(body)
        try:
            check_request(body)
        except (NonConforming, ValueError) as exc:
            await _send(send, 400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            return
        if self.status != 200:
            await _send(send, self.status, {"error": {"message": "rate limited", "type": "rate_limit_error"}})
            return
        answers = []
        for param in body["questions"]:
            question, value = question_of(param), self.table.get(param.get("name", ""))
            if value == "refuse":
                answers.append(answer_item(param.get("name"), question, None))
                continue
            if value is None:
                value = {} if not isinstance(question, Noul) else 0.5  # the options share 1 evenly
            answer = (
                value if isinstance(value, ChoiceAnswer | NoulAnswer | ScoreAnswer) else answer_from(question, value)
            )
            answers.append(answer_item(param.get("name"), question, answer))
        decision = {"model": self.model, "answers": answers, "usage": usage_json(self.usage)}
        Decision.model_validate(decision)  # what the SDK would read; raises on a shape it does not parse
        await _send(send, 200, decision)


async def _send(send: Send, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def answered_cases(config: Config) -> tuple[bool, list[tuple[Policy, PolicyTest, dict[str, Answer]]]]:
    """A configuration's policy test cases that feed an engine: whether it has any with answers, and those that
    answer every question their policy asks, with those answers (a case that leaves some unanswered tests the walk,
    not the engine)."""
    cases = [case for case in config.tests if isinstance(case, PolicyTest) and not case.engine_error
             and config.policies[case.policy].questions]  # fmt: skip
    full = []
    for case in cases:
        policy = config.policies[case.policy]
        answers = {qid: case.answers[qid] for qid in policy.questions if qid in case.answers}
        if len(answers) == len(policy.questions):
            full.append((policy, case, answers))
    return bool(cases), full
