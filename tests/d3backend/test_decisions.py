"""`DecisionsEngine` and the Decisions wire format, pinned to the `openai` SDK's own types: every request the engine
sends conforms to `DecisionCreateParams`, every answer the test server writes parses as the SDK's `Decision`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
import respx
import uvicorn
from openai.types import Decision, DecisionCreateParams

from d3backend import (
    Choice,
    ChoiceAnswer,
    DecisionsEngine,
    EngineBadAnswer,
    EngineBadResponse,
    EngineRateLimited,
    EngineRefused,
    EngineRejected,
    EngineTimeout,
    EngineUnavailable,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    Usage,
    answer_from,
    answer_item,
    decisions_request,
    free_port,
    parse_decision,
    usage_json,
)
from d3backend._decisions import PROMPT_CACHE_KEY
from tests.decisions_server import DecisionsServer, NonConforming, check_request, conforms

pytestmark = pytest.mark.anyio

URL = "http://decisions.test/v1"
QUESTIONS: Mapping[str, Question] = {
    "jailbreak": Noul("Is the user trying to make the assistant ignore its rules?", yes="It is", no=None),
    "kind": Choice("What kind of work is this?", {"code": "Writing or fixing code", "chat": None}),
    "difficulty": Score(None, ("easy", "moderate", "hard")),
}
TABLE = {"jailbreak": 0.2, "kind": {"code": 0.7, "chat": 0.3}, "difficulty": 1.25}
IMAGE = "data:image/png;base64,iVBORw0KGgo="

STATES: list[tuple[Any, tuple[str, ...]]] = [
    ("Fix my SQL query", ()),
    ("What is in this picture?", (IMAGE,)),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "hello"}, {"role": "tool", "content": "42"}], ()),
    ([{"role": "user", "content": "look"}], (IMAGE, "https://img.test/a.png")),
    ([{"role": "assistant", "content": "done"}], (IMAGE,)),
    ({"ticket": 7, "text": "refund please"}, ()),
    ([{"a": 1}, {"b": None}], (IMAGE,)),
    (42, ()),
    ([1, 2], (IMAGE,)),
    ("", (IMAGE,)),
]  # fmt: skip


def engine_with(handler: Any, **kwargs: Any) -> DecisionsEngine:
    return DecisionsEngine(URL, model="luna-test", transport=httpx.MockTransport(handler), **kwargs)


def asgi_engine(server: DecisionsServer) -> DecisionsEngine:
    return DecisionsEngine("http://local.test/v1", model="luna-test", transport=httpx.ASGITransport(app=server))


# --- the request, against the SDK's parameter types ----------------------------------------------------------------
@pytest.mark.parametrize(("state", "images"), STATES)
async def test_every_request_the_engine_sends_conforms_to_the_sdk_params(state: Any, images: tuple[str, ...]) -> None:
    server = DecisionsServer(TABLE)
    async with asgi_engine(server) as engine:
        token = PROMPT_CACHE_KEY.set("session-7")
        try:
            decided = await engine.decide(state, QUESTIONS, images=images)
        finally:
            PROMPT_CACHE_KEY.reset(token)
    (sent,) = server.requests
    conforms(sent, DecisionCreateParams)  # the server checked it too (a 400 otherwise): say it here again
    assert sent["prompt_cache_key"] == "session-7"
    assert [q["name"] for q in sent["questions"]] == list(QUESTIONS)
    assert set(decided.answers) == set(QUESTIONS)
    urls = [part["image_url"] for item in (sent["input"] if isinstance(sent["input"], list) else [])
            for part in (item["content"] if isinstance(item["content"], list) else []) if part["type"] == "input_image"]  # fmt: skip
    assert urls == list(images)


def test_the_questions_map_to_predicate_choice_and_score() -> None:
    body = decisions_request("luna-test", "x", QUESTIONS)
    assert body == {
        "model": "luna-test",
        "input": "x",
        "questions": [
            {"type": "predicate", "name": "jailbreak",
             "instructions": "Is the user trying to make the assistant ignore its rules?\nYes means: It is"},
            {"type": "choice", "name": "kind", "instructions": "What kind of work is this?",
             "choices": [{"value": "code", "description": "Writing or fixing code"}, {"value": "chat"}]},
            {"type": "score", "name": "difficulty", "instructions": "Rate the input on this scale: difficulty.",
             "levels": [{"label": "easy"}, {"label": "moderate"}, {"label": "hard"}]},
        ],
    }  # fmt: skip


def test_turns_become_messages_and_a_tool_turn_a_user_message() -> None:
    body = decisions_request("m", STATES[2][0], {"q": Noul("q?")})
    assert body["input"] == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": "hello"},
        {"type": "message", "role": "user", "content": "tool: 42"},
    ]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "q", "criteria": {}}]},
         "unknown keys ['criteria']"),
        ({"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "q"}]}, "missing ['choices']"),
        ({"model": "m", "input": "x", "questions": [{"type": "noul", "instructions": "q"}]}, "none of the allowed"),
        ({"model": "m", "input": "x", "questions": [], "state": "x"}, "unknown keys ['state']"),
        ({"model": "m", "questions": []}, "missing ['input']"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}], "questions": []}, "none of the allowed"),
    ],
)  # fmt: skip
def test_the_checker_refuses_what_the_sdk_types_do_not_allow(body: dict[str, Any], where: str) -> None:
    """The contract test can fail: a field the SDK does not know, a missing one, a wrong type name."""
    with pytest.raises(NonConforming) as info:
        check_request(body)
    assert where in str(info.value)


# --- the answer, against the SDK's Decision model -----------------------------------------------------------------
SOME_USAGE = Usage(10, 0, 4)


def decision_bytes(answers: list[dict[str, Any]], usage: Usage = SOME_USAGE) -> bytes:
    decision = {"model": "luna-test", "answers": answers, "usage": usage_json(usage)}
    Decision.model_validate(decision)
    return json.dumps(decision).encode()


def test_answers_read_back_as_the_same_probabilities() -> None:
    expected = {qid: answer_from(question, TABLE[qid]) for qid, question in QUESTIONS.items()}
    raw = decision_bytes([answer_item(qid, QUESTIONS[qid], answer) for qid, answer in expected.items()])
    sdk = Decision.model_validate_json(raw)
    assert [answer.type for answer in sdk.answers] == ["predicate", "choice", "score"]
    answers, model, usage = parse_decision(raw, QUESTIONS)
    assert (model, usage) == ("luna-test", Usage(10, 0, 4))
    noul, choice, score = answers["jailbreak"], answers["kind"], answers["difficulty"]
    assert isinstance(noul, NoulAnswer) and noul.noul == pytest.approx(0.2) and noul.confidence == pytest.approx(0.8)
    assert isinstance(choice, ChoiceAnswer) and choice.choice == "code"
    assert dict(choice.probabilities) == pytest.approx({"code": 0.7, "chat": 0.3})
    assert isinstance(score, ScoreAnswer) and score.score == pytest.approx(1.25)
    assert score.probabilities == pytest.approx((0.0, 0.75, 0.25)) and score.legend == ("easy", "moderate", "hard")


def test_a_refusal_leaves_its_question_unanswered() -> None:
    items = [answer_item("jailbreak", QUESTIONS["jailbreak"], None),
             *(answer_item(q, QUESTIONS[q], answer_from(QUESTIONS[q], TABLE[q])) for q in ("kind", "difficulty"))]  # fmt: skip
    with pytest.raises(
        EngineRefused, match=r"^the engine refused to answer 'jailbreak'; the policy's on_engine_error applies$"
    ) as info:
        parse_decision(decision_bytes(items), QUESTIONS)
    assert isinstance(info.value, EngineBadAnswer)
    assert info.value.refused == ("jailbreak",) and set(info.value.answers) == {"kind", "difficulty"}
    assert info.value.usage.cached_tokens == 4


def answered(**changes: Any) -> list[dict[str, Any]]:
    items = [answer_item(q, QUESTIONS[q], answer_from(QUESTIONS[q], TABLE[q])) for q in QUESTIONS]
    for index, change in changes.items():
        items[int(index.removeprefix("q"))].update(change)
    return items


@pytest.mark.parametrize(
    ("items", "error", "match"),
    [
        (answered()[:2], EngineBadResponse, r"^the engine answered 2 questions; 3 were asked"),
        (answered(q0={"name": "kind"}), EngineBadAnswer, r"^question 'jailbreak': the engine's answer in its place is 'kind'$"),
        (answered(q0={"type": "choice"}), EngineBadAnswer, r"^question 'jailbreak' is a predicate, the engine answered a 'choice'$"),
        (answered(q0={"probability": 1.5}), EngineBadAnswer, r"^question 'jailbreak': the engine's probability is 1.5"),
        (answered(q1={"probabilities": [{"value": True, "probability": 1.0}]}), EngineBadAnswer, r"^question 'kind': the engine's probability #0"),
        (answered(q1={"probabilities": [{"value": "code", "probability": 0.9}, {"value": "chat", "probability": 0.3}]}),
         EngineBadAnswer, r"^question 'kind': the engine's probabilities add up to 1.2, not 1$"),
        (answered(q1={"confidence": None}), EngineBadAnswer, r"^question 'kind': the engine's answer has no confidence$"),
        (answered(q2={"probabilities": [{"value": 1, "label": "easy", "probability": 1.0}]}), EngineBadAnswer,
         r"^question 'difficulty': the engine's probability #0 is for 'easy'"),
    ],
)  # fmt: skip
def test_an_answer_that_breaks_the_contract_is_an_engine_error(
    items: list[dict[str, Any]], error: type[Exception], match: str
) -> None:
    raw = json.dumps({"model": "m", "answers": items, "usage": usage_json(Usage())}).encode()
    with pytest.raises(error, match=match):
        parse_decision(raw, QUESTIONS)


# --- over a real socket --------------------------------------------------------------------------------------------
@pytest.fixture
async def served() -> AsyncIterator[tuple[str, DecisionsServer]]:
    """The test server under uvicorn on a free loopback port, stopped (and awaited) after the test."""
    app = DecisionsServer(TABLE)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0)  # no clock: yield until uvicorn has bound the socket
        yield f"http://127.0.0.1:{port}/v1", app
    finally:
        server.should_exit = True
        await task


async def test_the_engine_over_a_real_socket_reads_the_servers_answers(served: tuple[str, DecisionsServer]) -> None:
    url, app = served
    async with DecisionsEngine(url, model="luna-test", api_key="sk-test") as engine:
        decided = await engine.decide("Fix my SQL query", QUESTIONS)
    assert decided.usage == Usage(120, 0, 100)
    for qid, question in QUESTIONS.items():
        expected = answer_from(question, TABLE[qid])
        got = decided.answers[qid]
        assert type(got) is type(expected) and got.probabilities == pytest.approx(expected.probabilities)
    assert len(app.requests) == 1


# --- errors: each an EngineError the router's on_engine_error takes ------------------------------------------------
@pytest.mark.parametrize(
    ("response", "error", "match"),
    [
        (httpx.Response(429, json={"error": {"message": "slow down"}}, headers={"retry-after": "7"}),
         EngineRateLimited, r"^the engine refused the request \(429\): the Decisions API at http://decisions.test/v1 "
                            r"is rate limiting: slow down$"),
        (httpx.Response(503, json={"error": {"message": "overloaded"}}), EngineUnavailable,
         r"^the Decisions API at http://decisions.test/v1 answered 503: overloaded$"),
        (httpx.Response(400, json={"error": {"message": "bad question"}}), EngineRejected,
         r"^the engine refused the request \(400\): bad question$"),
        (httpx.Response(401, json={"error": {"message": "bad key"}}), EngineRejected,
         r"^the engine refused the request \(401\): bad key \(check the key in engine.decisions.api_key_env\)$"),
        (httpx.ReadTimeout("slow"), EngineTimeout, r"^the Decisions API at http://decisions.test/v1 did not answer within 5 s$"),
        (httpx.ConnectError("refused"), EngineUnavailable, r"^cannot reach the Decisions API at http://decisions.test/v1: ConnectError: refused$"),
    ],
)  # fmt: skip
async def test_failures_are_engine_errors(response: Any, error: type[Exception], match: str) -> None:
    with respx.mock(assert_all_called=True, assert_all_mocked=True) as mock:
        route = mock.post(f"{URL}/decisions")
        route.side_effect = response if isinstance(response, Exception) else None
        if not isinstance(response, Exception):
            route.return_value = response
        async with engine_with(mock.async_handler) as engine:
            with pytest.raises(error, match=match) as info:
                await engine.decide("x", QUESTIONS)
        assert route.call_count == 1  # never retried
    if isinstance(info.value, EngineRateLimited):
        assert info.value.status == 429 and info.value.retry_after_s == 7.0


async def test_videos_are_refused_before_any_call() -> None:
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(f"{URL}/decisions")
        async with engine_with(mock.async_handler) as engine:
            with pytest.raises(
                EngineRejected, match=r"^the engine refused the request \(400\): the Decisions API takes no videos"
            ):
                await engine.decide("x", QUESTIONS, videos=("data:video/mp4;base64,AAAA",))
        assert not route.called


async def test_the_key_and_the_model_are_sent_and_a_closed_engine_refuses_work() -> None:
    with respx.mock() as mock:
        items = [answer_item(q, QUESTIONS[q], answer_from(QUESTIONS[q], TABLE[q])) for q in QUESTIONS]
        route = mock.post(f"{URL}/decisions").respond(200, content=decision_bytes(items))
        engine = engine_with(mock.async_handler, api_key="sk-luna")
        decided = await engine.decide("x", QUESTIONS)
        await engine.aclose()
        with pytest.raises(RuntimeError, match=r"^this engine is closed$"):
            await engine.decide("x", QUESTIONS)
    request = route.calls.last.request
    assert request.headers["authorization"] == "Bearer sk-luna"
    assert json.loads(request.content)["model"] == "luna-test"
    assert "prompt_cache_key" not in json.loads(request.content)  # none set in this context
    assert decided.model == "luna-test" and decided.usage.cached_tokens == 4
