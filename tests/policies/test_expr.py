from __future__ import annotations

import re

import pytest

from d3backend import Answer, Choice, ChoiceAnswer, Noul, NoulAnswer, Question, Score, ScoreAnswer
from policies import ExpressionError, compile_condition

QUESTIONS: dict[str, Question] = {
    "kind": Choice(None, {"code": None, "math": None, "chat": None, "two words": None}),
    "jailbreak": Noul(None),
    "difficulty": Score(None, ("trivial", "easy", "hard", "expert")),
}

ANSWERS: dict[str, Answer] = {
    "kind": ChoiceAnswer("code", {"code": 0.7, "math": 0.2, "chat": 0.05, "two words": 0.05}, 0.7),
    "jailbreak": NoulAnswer(0.3, 0.7),
    "difficulty": ScoreAnswer(1.6, ("trivial", "easy", "hard", "expert"), (0.1, 0.3, 0.5, 0.1), 0.5),
}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("jailbreak > 0.2", True),
        ("jailbreak > 0.3", False),
        ("jailbreak >= 0.3", True),
        ("jailbreak < .5", True),
        ("jailbreak <= 0.29", False),
        ("jailbreak == 0.3", True),
        ("jailbreak != 0.3", False),
        ("jailbreak.yes > 0.25", True),
        ("jailbreak.no > 0.69", True),
        ("jailbreak.confidence == 0.7", True),
        ('kind == "code"', True),
        ("kind == 'math'", False),
        ('kind != "chat"', True),
        ('"code" == kind', True),
        ("kind.code > 0.6", True),
        ('kind["math"] >= 0.2', True),
        ('kind["two words"] < 0.1', True),
        ("kind.confidence > 0.69", True),
        ('kind in ["code", "math"]', True),
        ('kind in ["chat"]', False),
        ('kind not in ["chat", "math"]', True),
        ("difficulty >= 1.5", True),
        ("difficulty > 1.6", False),
        ("difficulty.hard >= 0.5", True),
        ('difficulty["expert"] > 0.2', False),
        ("difficulty.confidence == 0.5", True),
        ("0.2 < jailbreak <= 0.3", True),
        ("0.2 < jailbreak < 0.3", False),
        ("0 <= difficulty < 2 < 3", True),
        ('kind == "code" and difficulty >= 1.5', True),
        ('kind == "chat" or jailbreak > 0.9', False),
        ('kind == "chat" or jailbreak > 0.1', True),
        ("not jailbreak > 0.5", True),
        ("not (jailbreak > 0.1 and difficulty > 1)", False),
        ("(jailbreak > 0.9 or kind.code > 0.5) and not difficulty.trivial > 0.5", True),
        ("jailbreak > 0.9 or jailbreak < 0.1 or difficulty > 1", True),
        ("jailbreak > 1e-1", True),
        ("difficulty > -1", True),
        ("true", True),
        ("false or jailbreak > 0.2", True),
        ("not not true", True),
    ],
)
def test_condition_value(source: str, expected: bool) -> None:
    condition, _ = compile_condition(source, QUESTIONS)
    assert condition(ANSWERS) is expected


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("jailbreak > 0.2", {"jailbreak"}),
        ('kind == "code" and difficulty.hard > 0.5', {"kind", "difficulty"}),
        ("true", set()),
    ],
)
def test_referenced_questions(source: str, names: set[str]) -> None:
    _, referenced = compile_condition(source, QUESTIONS)
    assert referenced == names


@pytest.mark.parametrize(
    ("source", "message", "caret"),
    [
        ("", "the condition is empty; write one, e.g. `jailbreak > 0.9`, or leave out `when`", 0),
        (
            'kindd == "code"',
            "unknown question 'kindd'; expected one of 'kind', 'jailbreak', 'difficulty' (did you mean 'kind'?)",
            0,
        ),
        (
            'kind == "cod"',
            "unknown option 'cod' of choice 'kind'; expected one of 'code', 'math', 'chat', 'two words'"
            " (did you mean 'code'?)",
            8,
        ),
        (
            'kind in ["code", "cob"]',
            "unknown option 'cob' of choice 'kind'; expected one of 'code', 'math', 'chat', 'two words'",
            8,
        ),
        (
            "kind.foo > 0.1",
            "unknown option 'foo' of choice 'kind'; expected one of 'code', 'math', 'chat', 'two words'",
            5,
        ),
        (
            'kind["x"] > 0.1',
            "unknown option 'x' of choice 'kind'; expected one of 'code', 'math', 'chat', 'two words'",
            5,
        ),
        ("jailbreak.maybe > 0.1", "a noul has the options 'yes' and 'no', not 'maybe'", 10),
        (
            "difficulty.medium > 0.2",
            "unknown level 'medium' of score 'difficulty'; expected one of 'trivial', 'easy', 'hard', 'expert'",
            11,
        ),
        (
            'difficulty == "hard"',
            "cannot compare a number (the expected level of score 'difficulty', 0 to 3) with a string;"
            " for a level's or option's probability write e.g. `difficulty.hard > 0.5`",
            11,
        ),
        ("jailbreak == true", "cannot compare a number (P(yes) of noul 'jailbreak') with a condition", 10),
        ("kind == 1", "cannot compare a string (the pick of choice 'kind') with a number", 5),
        (
            "kind.code == kind",
            "cannot compare a number (the probability of kind.code) with a string (the pick of choice 'kind')",
            10,
        ),
        (
            "jailbreak",
            "expected a condition (true or false), found a number (P(yes) of noul 'jailbreak');"
            " compare it, e.g. `jailbreak > 0.5`",
            0,
        ),
        (
            "not difficulty",
            "expected a condition (true or false), found a number (the expected level of score 'difficulty', 0 to 3);"
            " compare it, e.g. `difficulty > 0.5`",
            4,
        ),
        ("kind", "expected a condition (true or false), found a string (the pick of choice 'kind')", 0),
        (
            "jailbreak > 0.5 and kind.code",
            "expected a condition (true or false), found a number (the probability of kind.code);"
            " compare it, e.g. `kind.code > 0.5`",
            20,
        ),
        (
            "kind['two words'] or true",
            "expected a condition (true or false), found a number (the probability of kind['two words']);"
            " compare it, e.g. `kind['two words'] > 0.5`",
            0,
        ),
        ("jailbreak >", "expected a value after '>'", 11),
        ('kind == "code" and', "the condition ends too early; expected a value", 18),
        ("(jailbreak > 0.5", "expected ')' to close '(', found the end of the condition", 16),
        ('kind in ["code"', "expected ']' to close '[', found the end of the condition", 15),
        ("jailbreak > 0.5 $", "unexpected character '$'", 16),
        ("jailbreak > 0.5 0.3", "unexpected '0.3'; expected `and`, `or` or the end", 16),
        ("> 0.5", "unexpected '>'; expected a question name, a number or a string", 0),
        ('kind in "code"', '\'in\' needs a list on its right, e.g. ["code", "math"]; found a string', 8),
        (
            "jailbreak in [1, 2]",
            "'in' compares a choice's pick with a list of option names; found a number (P(yes) of noul 'jailbreak')",
            0,
        ),
        ("kind in [jailbreak]", "a list holds only strings or numbers", 9),
        ('kind < "code"', "'<' compares numbers; a string (the pick of choice 'kind') takes only '==' or '!='", 5),
        ("true < false", "'<' compares numbers; a condition takes only '==' or '!='", 5),
        ('"a" == "b"', "this compares two strings; name a question on one side", 4),
        ("kind[code] > 1", "expected a quoted option name inside kind[...]", 5),
        ('kind["code" > 1', "expected ']' to close '[', found '>'", 12),
        ("kind. > 1", "expected an option name after 'kind.'", 6),
        ("jailbreak = 0.5", "unexpected character '='", 10),
    ],
)
def test_condition_errors(source: str, message: str, caret: int) -> None:
    with pytest.raises(ExpressionError, match=f"^{re.escape(message)}\n") as info:
        compile_condition(source, QUESTIONS)
    assert info.value.pos == caret
    assert str(info.value).endswith(f"\n    {source}\n    {' ' * caret}^")


def test_unknown_question_without_declared_questions() -> None:
    with pytest.raises(ExpressionError, match=r"^unknown question 'x'; expected one of none\n"):
        compile_condition("x > 1", {})


def test_string_escapes() -> None:
    questions: dict[str, Question] = {"q": Choice(None, {'say "hi"': None, "it's": None})}
    condition, _ = compile_condition(r'q == "say \"hi\"" or q == ' + r"'it\'s'", questions)
    assert condition({"q": ChoiceAnswer("it's", {'say "hi"': 0.4, "it's": 0.6}, 0.6)}) is True
    assert condition({"q": ChoiceAnswer('say "hi"', {'say "hi"': 0.6, "it's": 0.4}, 0.6)}) is True


def test_missing_answer_raises_key_error() -> None:
    condition, _ = compile_condition("jailbreak > 0.5", QUESTIONS)
    with pytest.raises(KeyError):
        condition({})
