"""`answer_from` at its tolerance: probabilities that add up to a hair over 1 are accepted (rounding in a hand-
written table) and the options left out get 0, never a negative probability (found by mutation testing:
benchmarks/results/mutation.md)."""

from __future__ import annotations

import pytest

from d3backend import Choice, ChoiceAnswer, Score, ScoreAnswer, answer_from

THREE = Choice(None, {"a": None, "b": None, "c": None})


def test_a_total_a_hair_over_one_leaves_the_other_options_at_zero_not_below() -> None:
    answer = answer_from(THREE, {"a": 0.5, "b": 0.5000005})
    assert isinstance(answer, ChoiceAnswer)
    assert answer.probabilities == {"a": 0.5, "b": 0.5000005, "c": 0.0}
    assert answer.choice == "b"


def test_a_score_level_left_out_of_a_total_over_one_is_zero_too() -> None:
    answer = answer_from(Score(None, ("easy", "medium", "hard")), {"easy": 0.4, "hard": 0.6000004})
    assert isinstance(answer, ScoreAnswer)
    assert answer.probabilities == (0.4, 0.0, 0.6000004)


def test_a_total_of_exactly_one_plus_the_tolerance_is_accepted_and_a_hair_more_is_not() -> None:
    assert answer_from(THREE, {"a": 1.0, "b": 1e-6}).probabilities == {"a": 1.0, "b": 1e-6, "c": 0.0}
    with pytest.raises(ValueError, match="add up to 1"):
        answer_from(THREE, {"a": 1.0, "b": 1.1e-6})
