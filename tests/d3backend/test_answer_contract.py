"""Issue 19.9: an answer that breaks the `/v1/systemone` contract is an engine error, never a silent 0.0.

A missing, NaN, infinite, negative or above-1 `confidence` or probability raises `EngineBadAnswer` (an
`EngineBadResponse`, so an `EngineError`) naming the question and the field; the router then takes
`on_engine_error` and counts the error under the class name.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from d3backend import (
    Choice,
    EngineBadAnswer,
    EngineBadResponse,
    EngineError,
    Noul,
    NoulAnswer,
    Question,
    RemoteEngine,
    Score,
)
from d3backend._wire import parse_response
from policies import parse_config
from router import RouterService

QUESTIONS: dict[str, Question] = {
    "kind": Choice(None, {"code": None, "chat": None}),
    "jailbreak": Noul(None),
    "difficulty": Score(None, ("easy", "hard")),
}
GOOD: dict[str, dict[str, Any]] = {
    "kind": {"type": "choice", "probabilities": {"code": 0.9, "chat": 0.1}, "confidence": 0.9},
    "jailbreak": {"type": "noul", "probabilities": {"yes": 0.2, "no": 0.8}, "confidence": 0.8},
    "difficulty": {"type": "score", "probabilities": {"0": 0.3, "1": 0.7}, "confidence": 0.7},
}


def body(qid: str, **changes: Any) -> bytes:
    answers = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is _MISSING:
            del answers[qid][key]
        else:
            answers[qid][key] = value
    # allow_nan: Python writes NaN and Infinity as the bare words some servers send
    return json.dumps({"model": "m", "answers": answers}, allow_nan=True).encode()


_MISSING = object()


def test_exception_tree() -> None:
    assert issubclass(EngineBadAnswer, EngineBadResponse)
    assert issubclass(EngineBadAnswer, EngineError)
    error = EngineBadAnswer("kind", "confidence", "question 'kind': no confidence")
    assert (error.question, error.field, str(error)) == ("kind", "confidence", "question 'kind': no confidence")


def test_a_good_answer_passes_with_its_confidence() -> None:
    answers, _, _ = parse_response(json.dumps({"answers": GOOD}).encode(), QUESTIONS)
    assert [answer.confidence for answer in answers.values()] == [0.9, 0.8, 0.7]


def test_confidence_zero_and_one_are_valid() -> None:
    for value in (0, 1, 0.0, 1.0):
        answers, _, _ = parse_response(body("jailbreak", confidence=value), QUESTIONS)
        assert answers["jailbreak"].confidence == value


def test_rounding_a_hair_above_one_is_read_as_one() -> None:
    # vLLM's confidence is a probability times a summed label mass, which rounding can put just above 1.
    answers, _, _ = parse_response(body("jailbreak", confidence=1.0000001), QUESTIONS)
    assert answers["jailbreak"].confidence == 1.0
    answers, _, _ = parse_response(body("jailbreak", probabilities={"yes": 1.0000001, "no": 0.0}), QUESTIONS)
    assert answers["jailbreak"].probabilities == {"yes": 1.0, "no": 0.0}
    with pytest.raises(EngineBadAnswer, match=r"confidence is 1\.00001; expected"):
        parse_response(body("jailbreak", confidence=1.00001), QUESTIONS)


@pytest.mark.parametrize(
    ("qid", "field", "value", "message"),
    [
        ("kind", "confidence", _MISSING, "question 'kind': the engine's answer has no confidence"),
        ("kind", "confidence", None, "question 'kind': the engine's answer has no confidence"),
        ("jailbreak", "confidence", float("nan"), "question 'jailbreak': the engine's confidence is nan; expected"),
        ("jailbreak", "confidence", float("inf"), "question 'jailbreak': the engine's confidence is inf; expected"),
        ("difficulty", "confidence", -0.1, "question 'difficulty': the engine's confidence is -0.1; expected"),
        ("difficulty", "confidence", 1.5, "question 'difficulty': the engine's confidence is 1.5; expected"),
    ],
)
def test_a_bad_confidence_is_an_engine_error(qid: str, field: str, value: Any, message: str) -> None:
    with pytest.raises(EngineBadAnswer, match=f"^{re.escape(message)}") as caught:
        parse_response(body(qid, **{field: value}), QUESTIONS)
    assert (caught.value.question, caught.value.field) == (qid, "confidence")


@pytest.mark.parametrize(
    ("qid", "probabilities", "field", "message"),
    [
        ("kind", {"code": float("nan"), "chat": 0.5}, "probabilities.code", "probability of 'code' is nan"),
        ("kind", {"code": 1.5, "chat": -0.5}, "probabilities.code", "probability of 'code' is 1.5"),
        ("jailbreak", {"yes": 1.0, "no": -0.0001}, "probabilities.no", "probability of 'no' is -0.0001"),
        ("difficulty", {"0": float("inf"), "1": 0}, "probabilities.0", "probability of '0' is inf"),
        ("kind", {"code": 0.7, "chat": 0.1}, "probabilities", "probabilities add up to 0.8, not 1"),
        ("kind", {"code": 1.0}, "probabilities", "probabilities are for ['code'], expected ['chat', 'code']"),
    ],
)
def test_a_bad_probability_is_an_engine_error(
    qid: str, probabilities: dict[str, float], field: str, message: str
) -> None:
    with pytest.raises(EngineBadAnswer, match=f"^{re.escape(f'question {qid!r}: the engine')}.*{re.escape(message)}"):
        parse_response(body(qid, probabilities=probabilities), QUESTIONS)
    with pytest.raises(EngineBadAnswer) as caught:
        parse_response(body(qid, probabilities=probabilities), QUESTIONS)
    assert (caught.value.question, caught.value.field) == (qid, field)


def test_a_missing_or_mistyped_answer_names_its_question() -> None:
    with pytest.raises(EngineBadAnswer, match=r"^the engine did not answer question 'kind'$") as caught:
        parse_response(json.dumps({"answers": {}}).encode(), QUESTIONS)
    assert (caught.value.question, caught.value.field) == ("kind", "")
    with pytest.raises(EngineBadAnswer, match=r"^question 'kind' is a choice, the engine answered a 'noul'$") as caught:
        parse_response(body("kind", type="noul"), QUESTIONS)
    assert (caught.value.question, caught.value.field) == ("kind", "type")


def test_drift_within_the_tolerance_is_still_renormalized() -> None:
    answers, _, _ = parse_response(body("kind", probabilities={"code": 0.9009, "chat": 0.1}), QUESTIONS)
    assert sum(answers["kind"].probabilities.values()) == pytest.approx(1.0, abs=1e-12)  # type: ignore[union-attr]
    with pytest.raises(EngineBadAnswer, match=r"add up to 1\.0011, not 1"):
        parse_response(body("kind", probabilities={"code": 0.9011, "chat": 0.1}), QUESTIONS)


CONFIG = """
engine: {remote: {urls: ["http://d3:8000"], model: m}}
upstreams:
  small: {url: "http://127.0.0.1:9/v1"}
policies:
  guard:
    questions:
      jailbreak: {type: noul}
    rules:
      - {name: block, when: jailbreak > 0.5, block: {status: 403, message: no}}
      - {name: default, route: small}
    on_engine_error: {block: {status: 503, message: the guard is down}}
"""


@pytest.mark.anyio
async def test_the_router_takes_on_engine_error_and_counts_the_reason() -> None:
    config = parse_config(CONFIG)
    answer = {"type": "noul", "probabilities": {"yes": 0.0, "no": 1.0}}  # no confidence: P(yes) 0 would pass

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"model": "m", "answers": {"jailbreak": answer}})

    async with RemoteEngine(["http://d3:8000"], model="m", transport=httpx.MockTransport(handler)) as engine:
        service = RouterService(config, engine)
        d3 = await service.decide(config.policies["guard"], {"messages": [{"role": "user", "content": "hi"}]})
    assert d3.decision.rule == "on_engine_error"
    assert d3.action == "block"
    assert d3.engine_error == "question 'jailbreak': the engine's answer has no confidence"
    assert 'd3router_engine_errors_total{kind="EngineBadAnswer"} 1.0' in service.metrics.render()


def test_noul_answer_unchanged_for_valid_input() -> None:
    answers, _, _ = parse_response(body("jailbreak", probabilities={"yes": 0.25, "no": 0.75}), QUESTIONS)
    assert answers["jailbreak"] == NoulAnswer(0.25, 0.8)
