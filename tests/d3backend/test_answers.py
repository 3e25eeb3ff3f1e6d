"""The answer shorthand used by fakes and policy test cases."""

from __future__ import annotations

import re

import pytest

from d3backend import Choice, ChoiceAnswer, Noul, NoulAnswer, Score, ScoreAnswer, answer_from

KIND = Choice(None, {"code": None, "math": None, "chat": None})
LEVELS = ("trivial", "easy", "hard", "expert")
DIFFICULTY = Score(None, LEVELS)


@pytest.mark.parametrize(
    ("question", "value", "expected"),
    [
        (Noul(None), 0.97, NoulAnswer(0.97, 0.97)),
        (Noul(None), 0.2, NoulAnswer(0.2, 0.8)),
        (Noul(None), True, NoulAnswer(1.0, 1.0)),
        (Noul(None), 0, NoulAnswer(0.0, 1.0)),
        (KIND, "math", ChoiceAnswer("math", {"code": 0.0, "math": 1.0, "chat": 0.0}, 1.0)),
        (KIND, {"code": 0.6}, ChoiceAnswer("code", {"code": 0.6, "math": 0.2, "chat": 0.2}, 0.6)),
        (
            KIND,
            {"code": 0.3, "math": 0.3, "chat": 0.4},
            ChoiceAnswer("chat", {"code": 0.3, "math": 0.3, "chat": 0.4}, 0.4),
        ),
        (DIFFICULTY, 2, ScoreAnswer(2.0, LEVELS, (0.0, 0.0, 1.0, 0.0), 1.0)),
        (DIFFICULTY, 3, ScoreAnswer(3.0, LEVELS, (0.0, 0.0, 0.0, 1.0), 1.0)),
        (DIFFICULTY, 0.25, ScoreAnswer(0.25, LEVELS, (0.75, 0.25, 0.0, 0.0), 0.75)),
        (DIFFICULTY, "hard", ScoreAnswer(2.0, LEVELS, (0.0, 0.0, 1.0, 0.0), 1.0)),
        (DIFFICULTY, {"easy": 0.5, "hard": 0.5}, ScoreAnswer(1.5, LEVELS, (0.0, 0.5, 0.5, 0.0), 0.5)),
    ],
)
def test_answer_shorthand(question: Choice | Noul | Score, value: object, expected: object) -> None:
    assert answer_from(question, value) == expected


@pytest.mark.parametrize(
    ("question", "value", "message"),
    [
        (Noul(None), 1.5, "a noul's answer is P(yes), a number from 0 to 1; found 1.5"),
        (Noul(None), "yes", "a noul's answer is P(yes), a number from 0 to 1; found 'yes'"),
        (KIND, "cod", "unknown option 'cod'; expected one of 'code', 'math', 'chat'"),
        (KIND, 3, "expected an option name or a mapping of option probabilities; found 3"),
        (KIND, {"code": 1.2}, "the probability of 'code' must be a number from 0 to 1; found 1.2"),
        (KIND, {"code": True}, "the probability of 'code' must be a number from 0 to 1; found True"),
        (KIND, {"code": 0.7, "math": 0.7}, "the probabilities add up to 1.4; expected 1"),
        (KIND, {"code": 0.2, "math": 0.2, "chat": 0.2}, "the probabilities add up to 0.6; expected 1"),
        (DIFFICULTY, 3.5, "a score's answer is its expected level, a number from 0 to 3; found 3.5"),
        (DIFFICULTY, -1, "a score's answer is its expected level, a number from 0 to 3; found -1"),
        (DIFFICULTY, "medium", "unknown level 'medium'; expected one of 'trivial', 'easy', 'hard', 'expert'"),
    ],
)
def test_answer_shorthand_errors(question: Choice | Noul | Score, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        answer_from(question, value)
