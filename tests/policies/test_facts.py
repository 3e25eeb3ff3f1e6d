"""Facts in `when` (issue 29.1): typed at load like questions, read beside the answers, and a walk they settle
needs no answer at all."""

from __future__ import annotations

import re
from typing import Any

import pytest

from d3backend import Answer, answer_from
from policies import FACTS, ConfigError, Policy, compile_condition, parse_config
from policies._policy import staging

HEAD = """upstreams:
  small: {url: http://a/v1}
  long: {url: http://b/v1}
policies:
  auto:
"""
CONFIG = """    ask: {ask}
    questions: {{jailbreak: {{type: noul}}, kind: {{type: choice, criteria: {{code: null, chat: null}}}}}}
    rules:
      - {{name: long-context, when: request.tokens > 1000, route: long}}
      - {{name: batch, when: caller.group == "batch" and not request.stream, route: small, tag: {{x-batch: "1"}}}}
      - {{name: guard, when: jailbreak > 0.9, block: {{status: 403, message: No.}}}}
      - {{name: responses-code, when: 'request.api == "responses" and kind == "code"', route: long}}
      - {{name: default, route: small}}
"""
FACTS_IN = {"request.tokens": 10, "caller.group": "", "request.stream": False, "request.api": "chat"}


def policy(ask: str = "together") -> Policy:
    return parse_config(HEAD + CONFIG.format(ask=ask), "c.yaml").policies["auto"]


def answered(policy: Policy, **values: Any) -> dict[str, Answer]:
    return {qid: answer_from(policy.questions[qid], value) for qid, value in values.items()}


def rules(*lines: str) -> str:
    body = "".join(f"      - {line}\n" for line in lines)
    return f"{HEAD}    questions: {{j: {{type: noul}}}}\n    rules:\n{body}      - {{name: default, route: small}}\n"


# --- parsing: every fact compiles with its type ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "known", "expected"),
    [
        ("request.tokens > 100000", {"request.tokens": 150000}, True),
        ("request.tokens > 100000", {"request.tokens": 99999}, False),
        ("request.chars >= 10 and request.turns == 2", {"request.chars": 10, "request.turns": 2}, True),
        ("request.tools > 0 or request.images > 0", {"request.tools": 0, "request.images": 0}, False),
        ("request.videos > 0", {"request.videos": 1}, True),
        ("request.stream", {"request.stream": True}, True),
        ("not request.stream", {"request.stream": True}, False),
        ("request.stream == false", {"request.stream": False}, True),
        ('request.api in ["chat", "messages"]', {"request.api": "messages"}, True),
        ('request.api != "chat"', {"request.api": "chat"}, False),
        ('caller.name == "nightly"', {"caller.name": "nightly"}, True),
        ('caller.group == ""', {"caller.group": ""}, True),
        ("session.turns >= 20", {"session.turns": 3}, False),
        ("budget.used >= 0.8", {"budget.used": 0.85}, True),
    ],
)
def test_each_fact_compiles_with_its_type(source: str, known: dict[str, Any], expected: bool) -> None:
    condition, reads = compile_condition(source, {})
    assert reads == frozenset(known)
    assert condition(known) is expected


def test_every_fact_has_a_scope_a_type_and_a_description() -> None:
    assert set(FACTS) == {
        "request.tokens", "request.chars", "request.turns", "request.tools", "request.images", "request.videos",
        "request.stream", "request.api", "caller.name", "caller.group", "session.turns", "budget.used",
    }  # fmt: skip
    assert FACTS["request.api"].options == ("chat", "completions", "responses", "messages")
    assert {fact.type for fact in FACTS.values()} == {"number", "string", "bool"}


# --- load errors: unknown facts and type mismatches name the rule ---------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        pytest.param(
            "{name: big, when: request.tokenz > 5, route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'big': unknown fact 'request\.tokenz'; expected one"
            r" of 'request\.tokens', .*, 'request\.api' \(did you mean 'request\.tokens'\?\)\n",
            id="unknown fact",
        ),
        pytest.param(
            "{name: who, when: caller.key == 'x', route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'who': unknown fact 'caller\.key'; expected one"
            r" of 'caller\.name', 'caller\.group' \(did you mean 'caller\.name'\?\)\n",
            id="unknown fact of a scope",
        ),
        pytest.param(
            "{name: bare, when: request > 5, route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'bare': expected a fact after 'request', e\.g\."
            r" `request\.tokens`\n",
            id="a scope alone",
        ),
        pytest.param(
            "{name: num, when: request.tokens == 'many', route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'num': cannot compare a number \(the fact"
            r" 'request\.tokens'\) with a string\n",
            id="number with a string",
        ),
        pytest.param(
            "{name: api, when: request.api == 'chatt', route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'api': unknown value 'chatt' of fact 'request\.api';"
            r" expected one of 'chat', 'completions', 'responses', 'messages' \(did you mean 'chat'\?\)\n",
            id="an API no router serves",
        ),
        pytest.param(
            "{name: flag, when: request.stream > 0, route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'flag': cannot compare a condition \(the fact"
            r" 'request\.stream'\) with a number\n",
            id="bool with a number",
        ),
        pytest.param(
            "{name: size, when: request.tokens, route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'size': expected a condition \(true or false\),"
            r" found a number \(the fact 'request\.tokens'\); compare it, e\.g\. `request\.tokens > 0\.5`\n",
            id="a number as a condition",
        ),
        pytest.param(
            "{name: grp, when: caller.group > 'a', route: long}",
            r"^c\.yaml:8:\d+: policies\.auto\.rules\[0\]\.when: rule 'grp': '>' compares numbers; a string \(the fact"
            r" 'caller\.group'\) takes only '==' or '!='\n",
            id="an order on a string",
        ),
    ],
)
def test_a_bad_fact_is_a_load_error_naming_the_rule(rule: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(rules(rule), "c.yaml")


def test_a_question_may_not_take_a_facts_scope_name() -> None:
    text = rules("{name: d0, route: small}").replace(
        "questions: {j: {type: noul}}", "questions: {request: {type: noul}}"
    )
    with pytest.raises(
        ConfigError,
        match=r"^c\.yaml:6:5: policies\.auto\.questions: question id 'request' is reserved for facts"
        r" \(`request\.NAME` in `when`\); rename the question$",
    ):
        parse_config(text, "c.yaml")


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ("{request.tokenz: 5}", r"tests\[0\]\.facts\.request\.tokenz: unknown fact 'request\.tokenz'; expected one of"),
        ("{request.tokens: many}", r"tests\[0\]\.facts\.request\.tokens: fact 'request\.tokens' is a number, found 'many'$"),
        ("{request.stream: 1}", r"tests\[0\]\.facts\.request\.stream: fact 'request\.stream' is true or false, found 1$"),
        ("{request.tokens: true}", r"tests\[0\]\.facts\.request\.tokens: fact 'request\.tokens' is a number, found True$"),
        ("{request.api: grpc}", r"tests\[0\]\.facts\.request\.api: fact 'request\.api' is one of 'chat', .*, found 'grpc'$"),
    ],
)  # fmt: skip
def test_a_test_cases_facts_are_checked_at_load(facts: str, expected: str) -> None:
    text = (
        rules("{name: big, when: request.tokens > 5, route: long}")
        + f"    tests:\n      - {{facts: {facts}, expect: {{rule: big}}}}\n"
    )
    with pytest.raises(ConfigError, match=r"^c\.yaml:11:\d+: policies\.auto\." + expected):
        parse_config(text, "c.yaml")


# --- evaluation: facts beside the answers; a walk the facts settle needs no answer --------------------------------
def test_the_policy_knows_which_facts_it_reads_and_whether_they_can_settle_it() -> None:
    loaded = policy()
    assert loaded.facts == {"request.tokens", "caller.group", "request.stream", "request.api"}
    assert loaded.settled_by_facts
    assert list(loaded.questions) == ["jailbreak", "kind"]
    guard_first = parse_config(rules("{name: g, when: j > 0.9, block: {status: 403, message: No.}}",
                                     "{name: big, when: request.tokens > 5, route: long}"), "c.yaml")  # fmt: skip
    assert not guard_first.policies["auto"].settled_by_facts  # the guard reads a question first: always asked
    tag_only = parse_config(
        rules("{name: big, when: request.tokens > 5, tag: {x-big: '1'}}", "{name: g, when: j > 0.9, route: long}"),
        "c.yaml",
    )
    assert not tag_only.policies["auto"].settled_by_facts  # a fact-only rule that tags cannot end the walk


def test_a_walk_over_facts_alone_ends_on_a_fact_rule() -> None:
    loaded = policy()
    decision = loaded.walk({}, {**FACTS_IN, "request.tokens": 150000})
    assert decision is not None and decision.rule == "long-context"
    assert [step.rule for step in decision.trace] == ["long-context"]
    batch = loaded.walk({}, {**FACTS_IN, "caller.group": "batch"})
    assert batch is not None and batch.rule == "batch" and batch.tags == {"x-batch": "1"}
    assert loaded.walk({}, {**FACTS_IN, "caller.group": "batch", "request.stream": True}) is None  # needs the guard


def test_evaluate_reads_facts_and_answers_together() -> None:
    loaded = policy()
    answers = answered(loaded, jailbreak=0.01, kind="code")
    assert loaded.evaluate(answers, {**FACTS_IN, "request.api": "responses"}).rule == "responses-code"
    assert loaded.evaluate(answers, FACTS_IN).rule == "default"
    assert loaded.evaluate(answered(loaded, jailbreak=0.97, kind="code"), FACTS_IN).rule == "guard"


def test_a_missing_fact_is_an_evaluation_error_that_says_so() -> None:
    from policies import EvaluationError

    with pytest.raises(
        EvaluationError,
        match=r"^rule 'long-context' of policy 'auto' reads 'request\.tokens', which has no value: give the facts$",
    ):
        policy().evaluate(answered(policy(), jailbreak=0.01))


def test_staged_does_not_end_its_first_stage_at_a_fact_rule() -> None:
    loaded = policy("staged")
    assert [list(stage) for stage in loaded.stages] == [["jailbreak"], ["kind"]]
    assert [list(stage) for stage in staging(loaded.rules, loaded.questions)] == [["jailbreak"], ["kind"]]
    walked = loaded.walk(answered(loaded, jailbreak=0.97), FACTS_IN)
    assert walked is not None and walked.rule == "guard"


def test_the_examples_facts_policy_decides_its_own_cases() -> None:
    from pathlib import Path

    from policies import load_config, run_test

    config = load_config(Path(__file__).parents[2] / "examples" / "facts.yaml")
    results = [run_test(config.policies[case.policy], case) for case in config.tests]
    assert all(result.passed for result in results), [result.message for result in results]
    assert re.search(r"request\.tokens > \d+", config.policies["auto"].rules[0].when or "")


def test_every_fact_is_documented() -> None:
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "policies.md").read_text()
    for name, fact in FACTS.items():
        assert f"| `{name}` | {'condition' if fact.type == 'bool' else fact.type} |" in page, name
