"""`overlap:` is checked at load (issue 31.1): its route an upstream, `sticky`/`agreeing` need a session."""

from __future__ import annotations

import pytest

from policies import ConfigError, OverlapSettings, parse_config

HEAD = """
upstreams: {small: {url: "http://127.0.0.1:1/v1"}, large: {url: "http://127.0.0.1:2/v1"}}
policies:
  auto:
    questions: {j: {type: noul}}
    rules:
      - {name: guard, when: j > 0.9, block: {status: 403, message: no}}
      - {name: default, route: small, tag: {x-tier: small}}
"""


def test_overlap_is_compiled() -> None:
    config = parse_config(
        HEAD.replace("  auto:\n", "  auto:\n    overlap: {when: agreeing, route: large, agreed: 3}\n")
    )
    assert config.policies["auto"].overlap == OverlapSettings("agreeing", "large", 3)
    assert parse_config(HEAD).policies["auto"].overlap is None


def test_the_expected_decision_carries_the_routes_own_tags() -> None:
    policy = parse_config(HEAD).policies["auto"]
    assert policy.expected().rule == "default" and dict(policy.expected().tags) == {"x-tier": "small"}
    assert policy.expected(("large",)).action.upstreams == ("large",)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("overlap", "session", "expected"),
    [
        (
            "{route: huge}",
            "",
            r"^c\.yaml:\d+:\d+: policies\.auto\.overlap\.route: unknown upstream 'huge'; expected one "
            r"of 'small', 'large'$",
        ),
        (
            "{when: sticky}",
            "    session: {mode: off}\n",
            r"^c\.yaml:\d+:\d+: policies\.auto\.overlap\.when: `when: "
            r"sticky` speculates on the session's route, but the ",
        ),
        ("{when: sometimes}", "", r"policies\.auto\.overlap\.when"),
    ],
)
def test_bad_overlaps_are_refused(overlap: str, session: str, expected: str) -> None:
    text = HEAD.replace("  auto:\n", f"  auto:\n    overlap: {overlap}\n{session}")
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, "c.yaml")
