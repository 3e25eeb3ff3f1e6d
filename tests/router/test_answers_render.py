"""How answers are rendered: the `x-d3-answers` header, the explain view and the decision log, score answers
included (issue 19: the score branch of `format_answers` and `_answer_json` had no test)."""

from __future__ import annotations

import io
import json

import pytest

from d3backend import ChoiceAnswer, FakeEngine, NoulAnswer, ScoreAnswer, answer_from
from d3backend import Score as ScoreQuestion
from policies import parse_config
from router import RouterService, format_answers

CONFIG = """
engine: {remote: {urls: ["http://d3:8000"], model: m}}
server: {decision_log: {path: "-"}}
upstreams:
  small: {url: "http://127.0.0.1:9/v1"}
  large: {url: "http://127.0.0.1:10/v1"}
policies:
  auto:
    questions:
      difficulty: {type: score, criteria: [trivial, easy, hard, expert]}
      kind: {type: choice, criteria: {code: null, chat: null}}
      jailbreak: {type: noul}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: no}}
      - {name: hard, when: difficulty >= 2 and kind == "code", route: large}
      - {name: default, route: small}
"""
BODY = {"messages": [{"role": "user", "content": "Prove the four colour theorem in Coq"}]}


def test_format_answers_renders_each_type() -> None:
    answers = {
        "kind": ChoiceAnswer("code", {"code": 0.914, "chat": 0.086}, 0.914),
        "jailbreak": NoulAnswer(0.021, 0.979),
        "difficulty": ScoreAnswer(1.404, ("easy", "medium", "hard"), (0.1, 0.396, 0.504), 0.504),
    }
    assert format_answers(answers) == "kind=code:0.91;jailbreak=0.02;difficulty=1.40"


@pytest.mark.parametrize(("score", "shown"), [(0.0, "0.00"), (2.5, "2.50"), (3.0, "3.00")])
def test_a_score_is_its_expected_level_with_two_decimals(score: float, shown: str) -> None:
    answer = answer_from(ScoreQuestion(None, ("trivial", "easy", "hard", "expert")), score)
    assert isinstance(answer, ScoreAnswer)
    assert format_answers({"difficulty": answer}) == f"difficulty={shown}"


@pytest.mark.anyio
async def test_score_answers_in_the_headers_the_explain_view_and_the_log() -> None:
    config = parse_config(CONFIG)
    log = io.StringIO()
    engine = FakeEngine({"difficulty": {"hard": 0.6, "expert": 0.4}, "kind": "code", "jailbreak": 0.0})
    service = RouterService(config, engine, decision_log=log)
    d3 = await service.decide(config.policies["auto"], BODY, request_id="req-1")
    assert d3.decision.rule == "hard"

    headers = dict(d3.headers(upstream="large", full=True))  # the debug view: the default one has no answers (25.4)
    assert "x-d3-answers" not in dict(d3.headers(upstream="large"))
    assert headers["x-d3-answers"] == "difficulty=2.40;kind=code:1.00;jailbreak=0.00"

    expected_score = {
        "type": "score",
        "score": pytest.approx(2.4),
        "legend": ["trivial", "easy", "hard", "expert"],
        "probabilities": [0.0, 0.0, 0.6, 0.4],
        "confidence": 0.6,
    }
    explained = d3.explain()["answers"]
    assert explained["difficulty"] == expected_score
    assert explained["kind"] == {
        "type": "choice",
        "choice": "code",
        "probabilities": {"code": 1.0, "chat": 0.0},
        "confidence": 1.0,
    }
    assert explained["jailbreak"] == {"type": "noul", "noul": 0.0, "confidence": 1.0}

    [line] = log.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["request_id"] == "req-1"
    assert entry["rule"] == "hard"
    assert entry["answers"]["difficulty"] == expected_score
    json.dumps(d3.explain())  # the explain view is JSON as it is
