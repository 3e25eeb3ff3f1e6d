"""The answer guard's compiler (policies/_answer.py `compile_answer`): every problem it reports, word for word and
where, what it refuses and what it only warns about, and the guard it builds from a valid `answer:` block. Pinned
where mutmut found changes no test of its selection noticed (issue 23)."""

from __future__ import annotations

import pytest

from d3backend import ChoiceAnswer, NoulAnswer
from policies import Block, ConfigError, Replace, parse_config
from policies._answer import AnswerTest
from policies._errors import EvaluationError

HEAD = """\
upstreams: {small: {url: http://small.test/v1}}
policies:
  guarded:
    rules: [{name: default, route: small}]
    answer:
"""
VALID = (
    HEAD
    + """\
      read: both
      context: false
      max_chars: 5000
      max_answer_bytes: 200000
      window_chars: 700
      overlap_chars: 50
      on_engine_error: pass
      questions:
        leak: {type: noul}
        unused: {type: noul}
        tone: {type: choice, criteria: {calm: Calm, angry: Angry}}
      rules:
        - {name: no-leak, when: leak > 0.9, block: {status: 451, message: Withheld.}}
        - {name: soften, when: 'tone == "angry"', replace: Let us start again.}
        - {name: marked, when: leak > 0.5, tag: {x-leak: maybe}}
      tests:
        - {name: leaks, answers: {leak: 0.95}, expect: {rule: no-leak}}
        - {answers: {tone: angry}, expect: {rule: soften}}
        - {engine_error: true, expect: {rule: on_engine_error}}
        - {answers: {leak: 0.1}, expect: {rule: "-"}}
"""
)


def refused(body: str) -> list[str]:
    """The lines of the ConfigError an `answer:` block with `body` gets."""
    with pytest.raises(ConfigError) as info:
        parse_config(HEAD + body, "c.yaml")
    return str(info.value).split("\n")


def test_a_valid_guard_keeps_what_its_rules_read_in_order_and_its_settings() -> None:
    config = parse_config(VALID, "c.yaml")
    guard = config.policies["guarded"].answer
    assert guard is not None
    assert list(guard.questions) == ["leak", "tone"]  # the unused one is not asked
    assert [str(w) for w in config.warnings] == [
        "c.yaml:15:9: policies.guarded.answer.questions.unused: answer question 'unused' is not used by any rule"
    ]
    assert [rule.name for rule in guard.rules] == ["no-leak", "soften", "marked"]
    first, second, third = guard.rules
    assert first.action == Block(451, "Withheld.") and first.when == "leak > 0.9" and first.reads == {"leak"}
    assert second.action == Replace("Let us start again.") and second.reads == {"tone"}
    assert third.action is None and third.tags == {"x-leak": "maybe"} and third.reads == {"leak"}
    assert all(rule.condition is not None for rule in guard.rules)
    assert (guard.read, guard.context, guard.max_chars, guard.max_answer_bytes) == ("both", False, 5000, 200000)
    assert (guard.window_chars, guard.overlap_chars, guard.on_engine_error) == (700, 50, "pass")
    cases = [case for case in config.tests if isinstance(case, AnswerTest)]
    assert [(case.policy, case.index, case.name, case.line) for case in cases] == [
        ("guarded", 0, "leaks", 22), ("guarded", 1, None, 23), ("guarded", 2, None, 24), ("guarded", 3, None, 25)]  # fmt: skip
    assert [case.engine_error for case in cases] == [False, False, True, False]
    assert [case.expect.rule for case in cases] == ["no-leak", "soften", "on_engine_error", "-"]
    assert [case.answers for case in cases] == [
        {"leak": NoulAnswer(noul=0.95, confidence=0.95)},
        {"tone": ChoiceAnswer(choice="angry", probabilities={"calm": 0.0, "angry": 1.0}, confidence=1.0)},
        {},
        {"leak": NoulAnswer(noul=0.1, confidence=0.9)},
    ]


def test_a_rule_name_used_twice_is_refused_at_the_second() -> None:
    assert refused("""\
      questions: {leak: {type: noul}}
      rules:
        - {name: r, when: leak > 0.5, tag: {x-a: b}}
        - {name: r, when: leak > 0.9, block: {status: 403, message: no}}
""") == ["c.yaml:9:12: policies.guarded.answer.rules[1].name: answer rule name 'r' is used twice"]


def test_a_condition_that_does_not_compile_is_refused_and_the_next_rule_still_checked() -> None:
    assert refused("""\
      questions: {leak: {type: noul}}
      rules:
        - {name: bad, when: leak >, block: {status: 403, message: no}}
        - {name: reads-a-fact, when: request.tokens > 10 and leak > 0.5, block: {status: 403, message: no}}
""") == [
        "c.yaml:8:23: policies.guarded.answer.rules[0].when: expected a value after '>'",
        "    leak >",
        "          ^",
        "c.yaml:9:32: policies.guarded.answer.rules[1].when: answer rule 'reads-a-fact' reads request.tokens: an "
        "answer rule reads only the answer's questions; route on facts in the policy's own rules",
    ]


def test_facts_read_by_an_answer_rule_are_named_sorted() -> None:
    lines = refused("""\
      questions: {leak: {type: noul}}
      rules:
        - name: f
          when: request.tokens > 1 and caller.group == "x" and budget.used > 0.5 and request.stream and caller.name
            == "y" and leak > 0.5
          block: {status: 403, message: n}
""")
    assert lines == [  # five, in their sorted order (a set's would differ from run to run)
        "c.yaml:9:11: policies.guarded.answer.rules[0].when: answer rule 'f' reads budget.used, caller.group, "
        "caller.name, request.stream, request.tokens: an answer rule reads only the answer's questions; route on "
        "facts in the policy's own rules"
    ]


def test_a_case_naming_an_unknown_question_or_rule_is_refused() -> None:
    lines = refused("""\
      questions: {leak: {type: noul}, tone: {type: noul}}
      rules: [{name: r, when: leak > 0.5 or tone > 0.5, block: {status: 403, message: no}}]
      tests:
        - {answers: {lek: 0.9, leak: 2}, expect: {rule: nope}}
""")
    assert lines == [
        "c.yaml:9:22: policies.guarded.answer.tests[0].answers.lek: unknown answer question 'lek'; expected one "
        "of 'leak', 'tone'",
        "c.yaml:9:32: policies.guarded.answer.tests[0].answers.leak: a noul's answer is P(yes), a number from 0 "
        "to 1; found 2",  # the value's own problem, reported where it is, after the unknown question's
        "c.yaml:9:51: policies.guarded.answer.tests[0].expect.rule: unknown answer rule 'nope'; expected one of "
        "'-', 'on_engine_error', 'r'",
    ]


def test_a_case_for_a_guard_without_questions_says_none_are_known() -> None:
    lines = refused("""\
      rules: [{name: always, block: {status: 403, message: no}}]
      tests:
        - {answers: {leak: 0.9}, expect: {rule: always}}
""")
    assert lines == [
        "c.yaml:8:22: policies.guarded.answer.tests[0].answers.leak: unknown answer question 'leak'; expected one "
        "of none"
    ]


def test_a_bad_answer_question_is_reported_where_it_is() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("engine: {max_choice_options: 2}\n" + HEAD + """\
      questions: {tone: {type: choice, criteria: {a: A, b: B, c: C}}}
      rules: [{name: r, when: 'tone == "a"', block: {status: 403, message: no}}]
""", "c.yaml")  # fmt: skip
    assert str(info.value) == (
        "c.yaml:7:40: policies.guarded.answer.questions.tone.criteria: this choice has 3 options; the engine takes "
        "at most 2 (engine.max_choice_options: 255 for d3 models, 26 for generative ones)"
    )


def test_the_rules_after_one_reading_a_fact_are_still_checked() -> None:
    assert refused("""\
      questions: {leak: {type: noul}}
      rules:
        - {name: f, when: request.stream and leak > 0.5, block: {status: 403, message: no}}
        - {name: g, when: leak >, block: {status: 403, message: no}}
""") == [
        "c.yaml:8:21: policies.guarded.answer.rules[0].when: answer rule 'f' reads request.stream: an answer rule "
        "reads only the answer's questions; route on facts in the policy's own rules",
        "c.yaml:9:21: policies.guarded.answer.rules[1].when: expected a value after '>'",
        "    leak >",
        "          ^",
    ]


def test_an_answer_rule_sets_nothing_and_names_a_question_without_an_answer() -> None:
    guard = parse_config(VALID, "c.yaml").policies["guarded"].answer
    assert guard is not None
    assert [rule.params for rule in guard.rules] == [{}, {}, {}]  # (an answer rule has no params: empty ones)
    with pytest.raises(EvaluationError) as info:
        guard.evaluate({})
    assert str(info.value) == "answer rule 'no-leak' reads 'leak', which has no answer"
