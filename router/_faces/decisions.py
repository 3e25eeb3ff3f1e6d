"""The router's engine, served to applications: `POST /v1/decisions` (the OpenAI Decisions API, which the `openai`
SDK's `client.decisions.create` calls) and `POST /v1/systemone` (vLLM's, SYSTEMONE.md), on `ProxyApp`'s routes.

    client = openai.OpenAI(base_url="http://router:8080/v1", api_key="...")
    decision = client.decisions.create(model="vllm-sr/d3-mini", input="Fix my SQL", questions=[...])

Both ask the router's engine through `RouterService.ask`: the same cache and single-flight, deadline, trace span
and metrics as a policy's questions. No policy is involved; `model` must be the engine's model (else 404); with an
engine pool, the pool's own name (`pool(a,b)`: failover as for policies) or one of its engines' models (those engines
alone answer, failing as they fail: the client asked for that model's probabilities). The
input's images obey `server.media_hosts`, `max_media_bytes` and `max_media_items` (the engine fetches URLs
itself); an image it may not have is refused (400), never dropped. docs/decisions.md says what maps to what.

With `server.auth` both need a client key and count against its rate limits, as every non-public path does
(`ProxyApp.__call__` checks both before the handler runs). `x-d3-cache` (whether someone sent the same input within
the cache's TTL) and `x-d3-engine` (an engine pool's engine that answered) are shown only to a key with `debug`, or
with `server.expose_decisions` (issue 25.4).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from d3backend import (
    MAX_QUESTIONS,
    MAX_SCORE_LEVELS,
    MIN_SCORE_LEVELS,
    POOL_MODEL,
    PROMPT_CACHE_KEY,
    CachedEngine,
    Choice,
    Decided,
    EngineError,
    EngineRefused,
    EngineRejected,
    FailoverEngine,
    JSONValue,
    Noul,
    Question,
    Score,
    answer_item,
    answer_wire,
    json_bytes,
    usage_json,
)
from policies import QuestionSpec, StateSettings, build_question
from router._apis.body import read_request
from router._apis.chat import CHAT
from router._apis.state import DecisionState, Turn, build_state
from router._asgi.messages import send_json
from router._decision.engines import trouble
from router._decision.service import RouterService
from router._errors import BadRequest, ModelNotFound, RequestError, UpstreamFailed, answer
from router._faces.auth import Caller

logger = logging.getLogger(__name__)


class Serves(Protocol):
    """What the handlers need of the app (`ProxyApp`): its service, read at each request (a reload swaps its
    configuration, not the service)."""

    service: RouterService


# --- the request bodies, at the trust boundary --------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # prompt_cache_breakpoint, detail: hints for hosted models
    type: Literal["input_text", "input_image", "input_json", "output_text", "refusal"]
    text: str | None = None
    image_url: str | None = None
    data: dict[str, Any] | list[dict[str, Any]] | None = None
    refusal: str | None = None


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # id, status, phase, namespace: nothing a decision reads
    type: Literal["message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output"] = (
        "message"
    )
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[_Part] | None = None
    name: str | None = None
    arguments: str | None = None
    input: str | None = None
    output: str | list[_Part] | None = None


class _Level(_Strict):
    label: str = Field(min_length=1)
    description: str | None = None


class _Option(_Strict):
    value: str | bool
    description: str | None = None


class _Question(_Strict):
    type: Literal["predicate", "choice", "score"]
    name: str | None = None
    instructions: str | list[_Part]
    choices: list[_Option] | None = None
    levels: list[_Level] | None = None


class _DecisionsBody(_Strict):
    model: str
    input: str | list[_Item]
    questions: list[_Question] = Field(min_length=1)
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None  # a hosted model's; the router's engine has no prompt cache
    safety_identifier: str | None = None


class _SystemoneBody(_Strict):
    model: str
    state: Any = None
    questions: dict[str, Any] = Field(min_length=1)
    images: list[str] = []
    videos: list[str] = []
    instructions: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    priority: int | None = None
    request_id: str | None = None


_QUESTION_SPEC: TypeAdapter[Any] = TypeAdapter(QuestionSpec)


# --- the handlers -------------------------------------------------------------------------------------------------
async def serve_decisions(app: Serves, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
    """`POST /v1/decisions`: a `Decision`, the answers in question order, a refusal where the engine refused."""
    service = app.service
    try:
        _, raw = await read_request(scope, receive, service.config.server.max_body_bytes)
        body = _parse(_DecisionsBody, raw)
        only = _check_model(service, body.model)
        questions, values = _questions(body.questions, service.config.engine.max_choice_options)
        turns = [Turn("user", body.input)] if isinstance(body.input, str) else [_turn(item) for item in body.input]
        state = _state(service, turns, "last_user" if isinstance(body.input, str) else "conversation")
        token = PROMPT_CACHE_KEY.set(body.prompt_cache_key)  # for a Decisions engine behind; d3 has no prompt cache
        narrowed = POOL_MODEL.set(only)
        try:
            decided, refused = await _ask(service, state.state, questions, state.images, ())
        finally:
            POOL_MODEL.reset(narrowed)
            PROMPT_CACHE_KEY.reset(token)
    except RequestError as exc:
        await _fail(service, send, exc, "decisions")
        return
    answers = [
        answer_item(qid, question, None if qid in refused else decided.answers[qid], values.get(qid, ()))
        for qid, question in questions.items()
    ]
    payload = {"id": f"decision_{uuid.uuid4().hex}", "object": "decision", "model": decided.model,
               "answers": answers, "usage": usage_json(decided.usage)}  # fmt: skip
    await _answer(service, send, payload, decided, "decisions", caller)


async def serve_systemone(app: Serves, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
    """`POST /v1/systemone`: vLLM's structured decision, as SYSTEMONE.md writes it."""
    service = app.service
    try:
        _, raw = await read_request(scope, receive, service.config.server.max_body_bytes)
        body = _parse(_SystemoneBody, raw)
        only = _check_model(service, body.model)
        if body.instructions:
            raise BadRequest("a top-level `instructions` is refused: d3's prompt is fixed", "instructions")
        questions = {qid: _systemone_question(qid, spec, service) for qid, spec in body.questions.items()}
        media = (*(("image", url) for url in body.images), *(("video", url) for url in body.videos))
        checked = _state(service, [Turn("user", "", tuple(media))], "last_user")
        narrowed = POOL_MODEL.set(only)
        try:
            decided, _ = await _ask(service, body.state, questions, checked.images, checked.videos)
        finally:
            POOL_MODEL.reset(narrowed)
    except RequestError as exc:
        await _fail(service, send, exc, "systemone")
        return
    payload = {
        "id": f"decision-{uuid.uuid4().hex}", "object": "structured_decision", "created": int(time.time()),
        "model": decided.model, "answers": {qid: answer_wire(a) for qid, a in decided.answers.items()},
        "usage": {"input_tokens": decided.usage.input_tokens, "output_tokens": decided.usage.output_tokens},
    }  # fmt: skip
    await _answer(service, send, payload, decided, "systemone", caller)


# --- reading ------------------------------------------------------------------------------------------------------
def _parse(model: type[_DecisionsBody] | type[_SystemoneBody], raw: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BadRequest(
            f"the request body is invalid at {where or 'the top'}: {first['msg']}", where or None
        ) from None


def _check_model(service: RouterService, model: str) -> str | None:
    """The engine's model (None), or, for an engine pool, one of its engines' models (asked alone: `POOL_MODEL`);
    else `ModelNotFound`."""
    served = getattr(service.engine, "model", None)
    if served is None or model == served:
        return None
    engine = service.engine.engine if isinstance(service.engine, CachedEngine) else service.engine
    if isinstance(engine, FailoverEngine):
        if model in engine.models:
            return model
        served = " or ".join(repr(name) for name in (served, *engine.models))
        raise ModelNotFound(f"the model {model!r} does not exist; this router's engine pool serves {served}")
    raise ModelNotFound(f"the model {model!r} does not exist; this router's decision engine serves {served!r}")


def _text(content: str | list[_Part] | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A content's text (JSON parts as their text) and its images."""
    if content is None or isinstance(content, str):
        return content or "", ()
    texts: list[str] = []
    media: list[tuple[str, str]] = []
    for part in content:
        if part.type == "input_image":
            media.append(("image", part.image_url or ""))
        elif part.type == "input_json":
            texts.append(json.dumps(part.data, ensure_ascii=False))
        else:
            texts.append(part.text or part.refusal or "")
    return "\n".join(texts), tuple(media)


def _turn(item: _Item) -> Turn:
    if item.type == "message":
        text, media = _text(item.content)
        return Turn(item.role or "user", text, media)
    if item.type in ("function_call", "custom_tool_call"):
        return Turn("assistant", "", (), (f"[tool call] {item.name}({item.arguments or item.input or ''})",))
    text, media = _text(item.output)
    return Turn("tool", text, media)


def _state(service: RouterService, turns: list[Turn], source: str) -> DecisionState:
    """The state text, images and videos, under the server's media rules; a refused item is a 400, not dropped.
    The text is never cut (the budget is the body's): an application asks about what it sent."""
    settings = StateSettings(source, service.config.server.max_body_bytes)  # type: ignore[arg-type]
    state = build_state(turns, settings, service.media)
    if state.dropped:
        raise BadRequest(f"an input image or video is refused: {state.dropped[0]}")
    return state


def _instructions(value: str | list[_Part]) -> str:
    text, media = _text(value) if not isinstance(value, str) else (value, ())
    if media:
        raise BadRequest("a question's instructions may not hold images here; put them in the input", "questions")
    return text


def _questions(
    params: list[_Question], max_options: int
) -> tuple[dict[str, Question], dict[str, tuple[str | bool, ...]]]:
    """The questions by name (`q0`, `q1`, ... for unnamed ones) and each choice's typed values."""
    if len(params) > MAX_QUESTIONS:
        raise BadRequest(f"{len(params)} questions; this router's engine takes at most {MAX_QUESTIONS}", "questions")
    questions: dict[str, Question] = {}
    values: dict[str, tuple[str | bool, ...]] = {}
    for index, param in enumerate(params):
        qid = param.name if param.name is not None else f"q{index}"
        where = f"questions.{index}"
        if qid in questions:
            raise BadRequest(f"the question name {qid!r} is used twice; names must be unique", where)
        instructions = _instructions(param.instructions)
        if param.type == "predicate":
            questions[qid] = Noul(instructions)
        elif param.type == "choice":
            options = param.choices or []
            if not 2 <= len(options) <= max_options:
                raise BadRequest(f"question {qid!r} has {len(options)} choices; expected 2 to {max_options}", where)
            keys = [str(o.value).lower() if isinstance(o.value, bool) else o.value for o in options]
            if len(set(keys)) != len(keys) or not all(keys):
                raise BadRequest(f"question {qid!r}: choice values must be unique and non-empty", where)
            questions[qid] = Choice(instructions, {k: o.description for k, o in zip(keys, options, strict=True)})
            values[qid] = tuple(o.value for o in options)
        else:
            levels = param.levels or []
            if not MIN_SCORE_LEVELS <= len(levels) <= MAX_SCORE_LEVELS or len({lv.label for lv in levels}) < len(
                levels
            ):
                raise BadRequest(
                    f"question {qid!r} has {len(levels)} levels; expected {MIN_SCORE_LEVELS} to {MAX_SCORE_LEVELS}"
                    " unique labels", where,
                )  # fmt: skip
            meanings = [f"{lv.label}: {lv.description}" for lv in levels if lv.description]
            questions[qid] = Score("\n".join([instructions, *meanings]), tuple(lv.label for lv in levels))
    return questions, values


def _systemone_question(qid: str, spec: Any, service: RouterService) -> Question:
    try:
        question: Question = build_question(_QUESTION_SPEC.validate_python(spec))
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise BadRequest(f"question {qid!r} is invalid: {first['msg']}", f"questions.{qid}") from None
    limit = service.config.engine.max_choice_options
    if isinstance(question, Choice) and len(question.options) > limit:
        raise BadRequest(f"question {qid!r} has {len(question.options)} options; at most {limit}", f"questions.{qid}")
    return question


# --- asking and answering -----------------------------------------------------------------------------------------


async def _ask(
    service: RouterService, state: JSONValue, questions: Mapping[str, Question], images: tuple[str, ...],
    videos: tuple[str, ...],
) -> tuple[Decided, frozenset[str]]:  # fmt: skip
    """The engine's answers and the questions it refused (a Decisions engine behind may refuse some)."""
    try:
        return await service.ask(state, questions, images=images, videos=videos), frozenset()
    except EngineRefused as exc:
        model = getattr(service.engine, "model", None) or ""
        return Decided(exc.answers, model, exc.usage, engine=exc.engine), frozenset(exc.refused)
    except EngineRejected as exc:
        raise (BadRequest if exc.status < 500 else UpstreamFailed)(exc.message, status=exc.status) from None
    except TimeoutError:
        timeout = service.config.server.decision_timeout_s
        raise UpstreamFailed(f"no decision within server.decision_timeout_s ({timeout:g} s)", status=504) from None
    except EngineError as exc:
        logger.warning("a typed question's engine call failed: %s", exc)  # its URL for the operator, not the caller
        status, message = trouble(exc)
        raise UpstreamFailed(message, status=status) from None


async def _answer(
    service: RouterService, send: Send, payload: dict[str, Any], decided: Decided, face: str, caller: Caller
) -> None:
    service.metrics.request("-", face, "decide", 200)
    headers: list[tuple[bytes, bytes]] = []
    if caller.debug or service.config.server.expose_decisions:  # the cache state tells of other callers' inputs
        headers.append((b"x-d3-cache", b"hit" if decided.cached else b"miss"))
        if decided.engine:  # the pool's engine that answered (engine.pool)
            headers.append((b"x-d3-engine", decided.engine.encode()))
    await send_json(send, 200, json_bytes(payload), headers)


async def _fail(service: RouterService, send: Send, exc: RequestError, face: str) -> None:
    service.metrics.request("-", face, "decide", exc.status)
    status, body, headers = answer(exc, CHAT)
    await send_json(send, status, body, headers)
