"""`when` conditions at their edges: exact values of `.yes`/`.no`, negative numbers, empty lists, escapes, and the
exact message and position of each error. Each test kills mutants mutmut found surviving
(benchmarks/results/mutation.md)."""

from __future__ import annotations

import pytest

from d3backend import Answer, Choice, ChoiceAnswer, Question
from policies import ExpressionError, compile_condition
from tests.policies.test_expr import ANSWERS, QUESTIONS

EXTRA: dict[str, Question] = {**QUESTIONS, "k": Choice(None, {"and": None, "Big": None, "a\tb": None})}
EXTRA_ANSWERS: dict[str, Answer] = {**ANSWERS, "k": ChoiceAnswer("Big", {"and": 0.2, "Big": 0.7, "a\tb": 0.1}, 0.7)}


def value(source: str) -> bool:
    condition, _ = compile_condition(source, EXTRA)
    return condition(EXTRA_ANSWERS)


def error(source: str) -> tuple[int, str]:
    with pytest.raises(ExpressionError) as caught:
        compile_condition(source, EXTRA)
    assert caught.value.source == source
    return caught.value.pos, caught.value.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("jailbreak.yes < 0.31", True),  # P(yes) is 0.3, not 1 - 0.3
        ("jailbreak.yes > 0.29", True),
        ("jailbreak.no < 0.71", True),  # P(no) is 0.7, not 1 + 0.3 nor 2 - 0.3
        ("jailbreak.no > 0.69", True),
        ("difficulty > -2", True),  # a negative number stays negative
        ("-2 < difficulty", True),
        ("kind in []", False),  # an empty list is a list
        ("kind not in []", True),
        ('kind == "tw\\o words"', False),  # an unknown escape keeps its character: "two words", a known option
        ('k == "a\\tb"', False),  # a known escape is the character it names
        ("k.and > 0.5", False),  # an option named like a keyword
        ("jailbreak.no > jailbreak.yes", True),  # two questions compared: both sides read the answers
    ],
)
def test_values(source: str, expected: bool) -> None:
    assert value(source) is expected


@pytest.mark.parametrize(
    ("source", "pos", "message"),
    [
        ("jailbreak.yes", 0, "expected a condition (true or false), found a number (the probability of jailbreak.yes); compare it, e.g. `jailbreak.yes > 0.5`"),
        ("jailbreak.no", 0, "expected a condition (true or false), found a number (the probability of jailbreak.no); compare it, e.g. `jailbreak.no > 0.5`"),
        ("kind.code", 0, "expected a condition (true or false), found a number (the probability of kind.code); compare it, e.g. `kind.code > 0.5`"),
        ("difficulty.hard", 0, "expected a condition (true or false), found a number (the probability of difficulty.hard); compare it, e.g. `difficulty.hard > 0.5`"),
        ("k.Big", 0, "expected a condition (true or false), found a number (the probability of k.Big); compare it, e.g. `k.Big > 0.5`"),
        ("jailbreak.confidence", 0, "expected a condition (true or false), found a number (the confidence of 'jailbreak'); compare it, e.g. `jailbreak.confidence > 0.5`"),
        ("kind", 0, "expected a condition (true or false), found a string (the pick of choice 'kind')"),
        ("  0.5", 2, "expected a condition (true or false), found a number"),
        ('  true in ["a"]', 2, "'in' compares a choice's pick with a list of option names; found a condition"),
        (' (jailbreak > 0.5 or jailbreak < 0.1) in ["a"]', 2, "'in' compares a choice's pick with a list of option names; found a condition"),
        (' (jailbreak > 0.5 and jailbreak < 0.1) in ["a"]', 2, "'in' compares a choice's pick with a list of option names; found a condition"),
        (' (not jailbreak > 0.5) in ["a"]', 2, "'in' compares a choice's pick with a list of option names; found a condition"),
        (' (jailbreak > 0.5) in ["a"]', 2, "'in' compares a choice's pick with a list of option names; found a condition"),
        (' (0.1 < jailbreak < 0.5) in ["a"]', 2, "'in' compares a choice's pick with a list of option names; found a condition"),
        ('kind in ["code", 1]', 0, "'in' compares a choice's pick with a list of option names; found a string (the pick of choice 'kind')"),
        ("jailbreak > 0.5 true", 16, "unexpected 'true'; expected `and`, `or` or the end"),
        ("jailbreak > not", 12, "unexpected 'not'; expected a question name, a number or a string"),
        ('["a"] > 0.5', 6, "cannot compare a list with a number"),
        ('["a"] == ["b"]', 6, "cannot compare a list with a list"),
        ('kind == "cat"', 8, "unknown option 'cat' of choice 'kind'; expected one of 'code', 'math', 'chat', 'two words' (did you mean 'chat'?)"),
    ],
)  # fmt: skip
def test_errors(source: str, pos: int, message: str) -> None:
    assert error(source) == (pos, message)


def test_a_negative_number_is_its_value_not_a_multiple() -> None:
    # Facts are given freely in a policy's `tests:` cases: -0.5 must read as -0.5 (a mutant of the sign read -1.0).
    condition, names = compile_condition("budget.used > -0.5", {})
    assert names == {"budget.used"}
    assert [condition({"budget.used": used}) for used in (-0.75, -0.5, -0.25)] == [False, False, True]
