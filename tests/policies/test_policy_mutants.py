"""A policy's default decision (what an overlap speculates on) and its guards, which API pairs the router can translate,
an unknown fact in a test case, a question of a kind without options: pinned where mutmut found a change no test of
its selection noticed (issue 23)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from d3backend import NoulAnswer
from policies import (
    APIS,
    FACTS,
    ConfigError,
    EvaluationError,
    ExpressionError,
    Policy,
    Route,
    compile_condition,
    parse_config,
    run_test,
    translatable,
)
from policies._answer import AnswerTest

CONFIG = """\
upstreams: {small: {url: http://small.test/v1}, big: {url: http://big.test/v1}}
policies:
  p:
    questions: {j: {type: noul}}
    rules:
      - {name: guard, when: j > 0.9, block: {status: 403}}
      - {name: big, when: j > 0.5, route: big}
      - {name: default, route: small, tag: {x-tier: small}}
"""


def policy() -> Policy:
    return parse_config(CONFIG, "c.yaml").policies["p"]


def test_the_expected_decision_is_the_last_rules_not_the_second() -> None:
    expected = policy().expected()
    assert (expected.policy, expected.rule, expected.tags) == ("p", "default", {"x-tier": "small"})
    assert isinstance(expected.action, Route) and expected.action.upstreams == ("small",)


def test_a_policy_whose_last_rule_cannot_route_has_no_expected_decision() -> None:
    # The loader always ends a policy with a route; one built otherwise is refused by name, not decided.
    built = policy()
    broken = dataclasses.replace(built, rules=(*built.rules[:-1], dataclasses.replace(built.rules[-1], action=None)))
    with pytest.raises(EvaluationError, match=r"^policy 'p' has no default route$"):
        broken.expected()
    with pytest.raises(EvaluationError, match=r"^policy 'p' has no default route$"):  # nor walked to one
        broken.evaluate({"j": NoulAnswer(0.1, 1.0)})


def test_a_policy_whose_on_engine_error_cannot_act_is_refused_by_name() -> None:
    built = policy()
    broken = dataclasses.replace(built, on_engine_error=dataclasses.replace(built.on_engine_error, action=None))
    with pytest.raises(EvaluationError, match=r"^policy 'p' has no on_engine_error action$"):
        broken.engine_failed()


# Which client API can reach an upstream of which API: its own, a registered pair, or two pairs through chat.
REACHABLE = {
    ("chat", "messages"), ("chat", "responses"), ("messages", "chat"), ("responses", "chat"),
    ("messages", "responses"), ("responses", "messages"),
}  # fmt: skip


@pytest.mark.parametrize("client", APIS)
def test_each_api_reaches_its_own_the_registered_pairs_and_the_pairs_composed_through_chat(client: str) -> None:
    assert translatable(client, None)
    assert translatable(client, client)
    for upstream in APIS:
        if upstream != client:
            assert translatable(client, upstream) == ((client, upstream) in REACHABLE), (client, upstream)


def test_an_unknown_fact_in_a_test_case_names_every_fact_in_order() -> None:
    text = CONFIG + "    tests: [{facts: {nope: 1}, expect: {rule: default}}]\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    (issue,) = caught.value.issues
    head, listed = issue.message.split("; expected one of ")
    assert head == "unknown fact 'nope'"
    assert listed.split(", ") == [repr(name) for name in FACTS]


class Freeform:
    """A kind of question the language has no options for (as a kind added later might be)."""


def test_an_option_of_a_question_without_options_is_refused_at_the_option() -> None:
    questions: dict[str, Any] = {"x": Freeform()}
    with pytest.raises(ExpressionError) as caught:
        compile_condition("x.a > 0.5", questions)
    assert (caught.value.message, caught.value.pos) == ("'x' is not a question with options", 2)


def test_a_case_without_the_facts_a_rule_reads_says_to_give_them_in_facts() -> None:
    text = CONFIG.replace("      - {name: guard,", "      - {name: long, when: request.tokens > 1000, route: big}\n"
                          "      - {name: guard,") + "    tests: [{answers: {j: 0.1}, expect: {rule: default}}]\n"  # fmt: skip
    config = parse_config(text, "c.yaml")
    (result,) = [run_test(config.policies["p"], case) for case in config.tests]
    assert not result.passed
    assert result.message == (
        "rule 'long' of policy 'p' reads 'request.tokens', which has no value: give the facts; give it in `facts`"
    )


def test_an_answer_case_run_against_a_policy_without_a_guard_fails_saying_so() -> None:
    guarded = CONFIG + (
        "    answer:\n      questions: {leak: {type: noul}}\n"
        "      rules: [{name: no-leak, when: leak > 0.8, block: {status: 403}}]\n"
        "      tests: [{answers: {leak: 0.9}, expect: {outcome: block}}]\n"
    )
    (case,) = [case for case in parse_config(guarded, "c.yaml").tests if isinstance(case, AnswerTest)]
    result = run_test(policy(), case)
    assert (result.test, result.passed, result.message, result.decision) == (
        case, False, "the policy has no answer guard", None
    )  # fmt: skip


STICKY = """\
upstreams: {small: {url: http://small.test/v1}, large: {url: http://large.test/v1}, spare: {url: http://spare.test/v1}}
policies:
  p:
    questions: {hard: {type: noul}, code: {type: noul}}
    rules:
      - {name: failover, when: hard > 0.95, route: [large, spare], tag: {x-tier: failover}}
      - {name: hard, when: hard > 0.5, route: large, tag: {x-tier: large}, set: {temperature: 0.1}}
      - {name: coding, when: code > 0.5, tag: {x-kind: code}}
      - {name: default, route: small, tag: {x-tier: small}, set: {max_tokens: 7}}
"""


def test_a_decision_sent_on_another_route_keeps_the_tags_of_the_rules_before_and_takes_the_routes() -> None:
    sticky = parse_config(STICKY, "c.yaml").policies["p"]
    decided = sticky.evaluate({"hard": NoulAnswer(0.1, 1.0), "code": NoulAnswer(0.9, 1.0)})
    assert (decided.rule, decided.tags) == ("default", {"x-kind": "code", "x-tier": "small"})
    exact = sticky.sent_on(decided, ("large",))  # the rule routing to exactly these, not the first starting with them
    assert (exact.rule, exact.tags, exact.params) == ("default", {"x-kind": "code", "x-tier": "large"},
                                                      {"temperature": 0.1})  # fmt: skip
    assert isinstance(exact.action, Route) and exact.action.upstreams == ("large",)
    first = sticky.sent_on(decided, ("large", "small"))  # no rule routes so: the first starting with `large`
    assert (first.tags, first.params) == ({"x-kind": "code", "x-tier": "failover"}, {})


def test_a_block_or_a_decision_already_on_those_upstreams_is_sent_on_unchanged() -> None:
    guarded = policy()
    blocked = guarded.evaluate({"j": NoulAnswer(0.97, 1.0)})
    assert blocked.rule == "guard"
    assert guarded.sent_on(blocked, ("big",)) is blocked  # a block has no route to change
    twice = parse_config(STICKY.replace("route: small, tag: {x-tier: small}", "route: large, tag: {x-tier: l2}"),
                         "c.yaml").policies["p"]  # fmt: skip
    decided = twice.evaluate({"hard": NoulAnswer(0.1, 1.0), "code": NoulAnswer(0.1, 1.0)})
    assert (decided.rule, decided.tags) == ("default", {"x-tier": "l2"})
    # Its own route: kept as decided, not re-dressed as the first rule routing to `large` (`hard`, x-tier: large).
    assert twice.sent_on(decided, ("large",)) is decided


def test_the_expected_decision_carries_the_default_rules_set_even_when_empty() -> None:
    assert policy().expected().params == {}
    assert parse_config(STICKY, "c.yaml").policies["p"].expected().params == {"max_tokens": 7}


@pytest.mark.parametrize(
    ("value", "refused"),
    [("a\tb", True), ("a\x7fb", True), ("a\u2028b", True), ("X-ray", False), ("é 100% XXL", False)],
)
def test_a_tag_value_is_refused_for_any_unprintable_character_and_only_for_one(value: str, refused: bool) -> None:
    text = CONFIG.replace("tag: {x-tier: small}", f"tag: {{x-tier: {value!r}}}".replace("'", '"'))
    if not refused:
        assert parse_config(text, "c.yaml").policies["p"].rules[-1].tags == {"x-tier": value}
        return
    with pytest.raises(ConfigError, match=r"the value of header 'x-tier' holds a control character$"):
        parse_config(text, "c.yaml")
