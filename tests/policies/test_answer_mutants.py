"""Answer guards' verdicts when the engine fails, and the words of their failed test cases (`answer.tests`), pinned
where mutmut found a change no test of its selection noticed (issue 23)."""

from __future__ import annotations

import pytest

from policies import AnswerVerdict, Block, parse_config, run_test
from policies._answer import AnswerTest
from policies._policy import Step

CONFIG = """\
upstreams: {small: {url: http://small.test/v1}}
policies:
  guarded:
    rules: [{name: default, route: small}]
    answer:
      %s
      questions: {destructive: {type: noul}, leak: {type: noul}}
      rules:
        - {name: no-destruction, when: destructive > 0.8, block: {status: 403, message: Refused.}}
        - {name: marked, when: leak > 0.5, tag: {x-leak: maybe}}
        - {name: no-leak, when: leak > 0.8, replace: withheld}
      tests:
%s
"""
ENGINE_FAILED = (Step("on_engine_error", None, True),)


def failures(*cases: str, on_engine_error: str = "block") -> list[str]:
    """The message of each case of the guard (empty: it passes), in order."""
    text = CONFIG % (f"on_engine_error: {on_engine_error}", "\n".join(f"        - {case}" for case in cases))
    config = parse_config(text, "c.yaml")
    policy = config.policies["guarded"]
    return [run_test(policy, case).message for case in config.tests if isinstance(case, AnswerTest)]


def guard(on_engine_error: str) -> AnswerVerdict:
    text = CONFIG % (f"on_engine_error: {on_engine_error}", "        - {expect: {outcome: pass}}")
    answer = parse_config(text, "c.yaml").policies["guarded"].answer
    assert answer is not None
    return answer.engine_failed()


def test_an_unjudged_answer_is_withheld_with_a_503_by_default() -> None:
    assert guard("block") == AnswerVerdict(
        "on_engine_error",
        Block(503, "The answer could not be checked, so it was withheld."),
        {},
        ENGINE_FAILED,
        degraded=True,
    )


def test_an_unjudged_answer_passes_degraded_when_the_guard_says_pass() -> None:
    assert guard("pass") == AnswerVerdict("on_engine_error", None, {}, ENGINE_FAILED, degraded=True)


def test_the_engine_error_cases_pass_as_written() -> None:
    assert failures(
        "{engine_error: true, expect: {rule: on_engine_error, outcome: block, status: 503, degraded: true}}"
    ) == [""]
    assert failures(
        "{engine_error: true, expect: {rule: on_engine_error, outcome: pass, degraded: true}}", on_engine_error="pass"
    ) == [""]


def test_cases_that_hold_pass() -> None:
    assert failures(
        "{answers: {destructive: 0.1, leak: 0.1}, expect: {rule: '-', outcome: pass, degraded: false}}",
        "{answers: {destructive: 0.9, leak: 0.1}, expect: {rule: no-destruction, outcome: block, status: 403}}",
        "{answers: {destructive: 0.1, leak: 0.6}, expect: {rule: '-', outcome: pass, tags: {x-leak: maybe}}}",
        "{answers: {destructive: 0.1, leak: 0.9}, expect: {rule: no-leak, outcome: replace, tags: {x-leak: maybe}}}",
    ) == ["", "", "", ""]


def test_a_passing_answer_expected_blocked_says_each_difference_and_the_trace() -> None:
    (message,) = failures(
        "{answers: {destructive: 0.1, leak: 0.1}, expect: {rule: no-destruction, outcome: block, status: 403}}"
    )
    assert message == (
        "expected answer rule 'no-destruction', got '-'; expected block, got pass; "
        "expected block status 403, got pass; trace: no-destruction (missed), marked (missed), no-leak (missed)"
    )


def test_a_block_of_another_status_says_the_status_it_got() -> None:
    (message,) = failures("{answers: {destructive: 0.9, leak: 0.1}, expect: {outcome: block, status: 451}}")
    assert message == "expected block status 451, got 403; trace: no-destruction"


def test_a_replaced_answer_expected_blocked_says_what_it_got() -> None:
    (message,) = failures("{answers: {destructive: 0.1, leak: 0.9}, expect: {status: 403}}")
    assert message == "expected block status 403, got replace; trace: no-destruction (missed), marked, no-leak"


@pytest.mark.parametrize(("leak", "got"), [(0.6, "'maybe'"), (0.1, "None")], ids=["another value", "not set"])
def test_a_tag_not_as_expected_says_what_it_got(leak: float, got: str) -> None:
    (message,) = failures(f"{{answers: {{destructive: 0.1, leak: {leak}}}, expect: {{tags: {{x-leak: sure}}}}}}")
    assert message.startswith(f"expected tag 'x-leak'='sure', got {got}; trace: ")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("{answers: {destructive: 0.1, leak: 0.1}, expect: {degraded: true}}", "expected degraded=true, got false"),
        ("{engine_error: true, expect: {degraded: false}}", "expected degraded=false, got true"),
    ],
    ids=["judged", "unjudged"],
)
def test_a_degraded_verdict_not_as_expected_says_both_in_lower_case(case: str, message: str) -> None:
    (got,) = failures(case)
    assert got.startswith(message + "; trace: ")
