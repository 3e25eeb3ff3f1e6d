"""Evaluation semantics: order, tag/set rules that continue, the default, fallback lists, on_engine_error."""

from __future__ import annotations

import pytest

from d3backend import Answer, ChoiceAnswer, NoulAnswer
from policies import Block, EvaluationError, Policy, Route, Step, parse_config

CONFIG = """
upstreams:
  small: {url: http://127.0.0.1:8001/v1}
  large: {url: http://127.0.0.1:8002/v1}
  backup: {url: http://127.0.0.1:8003/v1}
policies:
  auto:
    questions:
      kind: {type: choice, criteria: {code: null, chat: null}}
      pii: {type: noul}
      jailbreak: {type: noul}
    rules:
      - {name: tag-pii, when: pii > 0.5, tag: {x-pii: "yes", x-team: privacy}, set: {store: false}}
      - {name: guard, when: jailbreak > 0.9, block: {status: 451, message: Not here.}, tag: {x-guard: "1"}}
      - {name: team, tag: {x-team: platform}}
      - {name: code, when: kind == "code", route: [large, backup], set: {temperature: 0.1, store: true}}
      - {name: default, route: small}
  strict:
    on_engine_error: {block: {status: 403, message: The guard is unavailable.}, tag: {x-why: engine}}
    rules:
      - {name: default, route: [small, backup]}
  open:
    on_engine_error: {route: backup, set: {max_tokens: 64}}
    rules:
      - {name: default, route: small}
"""


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    return dict(parse_config(CONFIG).policies)


def answers(kind: str = "chat", pii: float = 0.0, jailbreak: float = 0.0) -> dict[str, Answer]:
    other = "chat" if kind == "code" else "code"
    return {
        "kind": ChoiceAnswer(kind, {kind: 0.8, other: 0.2}, 0.8),
        "pii": NoulAnswer(pii, max(pii, 1 - pii)),
        "jailbreak": NoulAnswer(jailbreak, max(jailbreak, 1 - jailbreak)),
    }


def test_default_route(policies: dict[str, Policy]) -> None:
    decision = policies["auto"].evaluate(answers())
    assert decision.rule == "default"
    assert decision.action == Route(("small",))
    assert decision.tags == {"x-team": "platform"}  # the unconditional tag rule applied and went on
    assert decision.params == {}
    assert decision.degraded is False
    assert decision.trace == (
        Step("tag-pii", "pii > 0.5", False),
        Step("guard", "jailbreak > 0.9", False),
        Step("team", None, True),
        Step("code", 'kind == "code"', False),
        Step("default", None, True),
    )


def test_first_terminal_rule_ends_the_walk(policies: dict[str, Policy]) -> None:
    decision = policies["auto"].evaluate(answers(kind="code"))
    assert decision.rule == "code"
    assert decision.action == Route(("large", "backup"))  # the fallback list, in order
    assert decision.params == {"temperature": 0.1, "store": True}
    assert [step.rule for step in decision.trace] == ["tag-pii", "guard", "team", "code"]


def test_block_keeps_the_tags_gathered_so_far(policies: dict[str, Policy]) -> None:
    decision = policies["auto"].evaluate(answers(kind="code", pii=0.9, jailbreak=0.95))
    assert decision.rule == "guard"
    assert decision.action == Block(451, "Not here.")
    assert decision.tags == {"x-pii": "yes", "x-team": "privacy", "x-guard": "1"}
    assert decision.params == {"store": False}


def test_later_rules_override_earlier_tags_and_params(policies: dict[str, Policy]) -> None:
    decision = policies["auto"].evaluate(answers(kind="code", pii=0.9))
    assert decision.tags == {"x-pii": "yes", "x-team": "platform"}
    assert decision.params == {"store": True, "temperature": 0.1}


def test_missing_answer_names_the_rule_and_question(policies: dict[str, Policy]) -> None:
    with pytest.raises(EvaluationError, match=r"^rule 'tag-pii' of policy 'auto' reads 'pii', which has no answer$"):
        policies["auto"].evaluate({})


def test_on_engine_error_defaults_to_the_default_route(policies: dict[str, Policy]) -> None:
    decision = policies["auto"].engine_failed()
    assert decision.action == Route(("small",))
    assert decision.rule == "on_engine_error"
    assert decision.degraded is True


def test_on_engine_error_block(policies: dict[str, Policy]) -> None:
    decision = policies["strict"].engine_failed()
    assert decision.action == Block(403, "The guard is unavailable.")
    assert decision.tags == {"x-why": "engine"}
    assert decision.degraded is True


def test_on_engine_error_route_with_params(policies: dict[str, Policy]) -> None:
    decision = policies["open"].engine_failed()
    assert decision.action == Route(("backup",))
    assert decision.params == {"max_tokens": 64}


def test_policy_without_questions_needs_no_engine(policies: dict[str, Policy]) -> None:
    assert policies["strict"].questions == {}
    assert policies["strict"].evaluate({}).action == Route(("small", "backup"))


def test_twenty_rules_in_order() -> None:
    rules = "\n".join(f"      - {{name: r{i}, when: score >= {i / 20}, tag: {{x-r{i}: '{i}'}}}}" for i in range(19))
    text = f"""
upstreams: {{small: {{url: http://a}}}}
policies:
  p:
    questions: {{score: {{type: noul}}}}
    rules:
{rules}
      - {{name: default, route: small}}
"""
    decision = parse_config(text).policies["p"].evaluate({"score": NoulAnswer(0.5, 0.5)})
    assert len(decision.trace) == 20
    assert sorted(decision.tags, key=lambda k: int(k[3:])) == [f"x-r{i}" for i in range(11)]
