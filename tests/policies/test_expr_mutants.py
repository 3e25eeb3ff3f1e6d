"""Facts in conditions at their edges: a scope without a fact, a keyword after the dot, and where each error points.
Pinned where mutmut found a change no test of its selection noticed (issue 23)."""

from __future__ import annotations

import pytest

from policies import ExpressionError, compile_condition


def refused(source: str) -> tuple[str, int]:
    with pytest.raises(ExpressionError) as caught:
        compile_condition(source, {})
    return caught.value.message, caught.value.pos


def test_a_scope_followed_by_a_keyword_asks_for_a_fact() -> None:
    assert refused("request and true") == ("expected a fact after 'request', e.g. `request.tokens`", 8)


def test_a_keyword_after_the_dot_is_read_as_an_unknown_fact_with_a_suggestion() -> None:
    message, pos = refused("request.in > 1")
    assert message.startswith("unknown fact 'request.in'; expected one of 'request.tokens', ")
    assert (message.endswith("(did you mean 'request.api'?)"), pos) == (True, 0)


def test_an_unknown_fact_points_at_its_scope() -> None:
    message, pos = refused("true and request.tokns > 5")
    assert message.endswith("(did you mean 'request.tokens'?)")
    assert pos == len("true and ")


def test_a_fact_used_as_a_condition_is_pointed_at() -> None:
    message, pos = refused("true and request.tokens")
    assert message.startswith("expected a condition (true or false), found a number (the fact 'request.tokens')")
    assert pos == len("true and ")


@pytest.mark.parametrize(
    ("source", "value", "at"),
    [
        ('request.api == "chatt" and true', "chatt", '"chatt"'),
        ('request.api in ["chat", "mesages"] or false', "mesages", "["),  # a list's value: the list is pointed at
    ],
)
def test_an_unknown_value_of_a_fact_is_pointed_at_not_at_where_reading_stopped(
    source: str, value: str, at: str
) -> None:
    message, pos = refused(source)
    assert message.startswith(f"unknown value {value!r} of fact 'request.api'; expected one of ")
    assert pos == source.index(at)
