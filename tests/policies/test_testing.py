"""Policy test cases: the expectations and the messages of failing cases."""

from __future__ import annotations

import pytest

from policies import ConfigError, parse_config, run_test

CONFIG = """
upstreams:
  small: {url: http://127.0.0.1:8001/v1}
  large: {url: http://127.0.0.1:8002/v1}
policies:
  auto:
    on_engine_error: {route: small, tag: {x-degraded: "1"}}
    questions:
      kind: {type: choice, criteria: {code: null, chat: null}}
      jailbreak: {type: noul}
      difficulty: {type: score, criteria: [easy, medium, hard]}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: no}}
      - {name: hard, when: kind == "code" and difficulty.hard > 0.5, route: [large, small], set: {effort: high},
         tag: {x-team: platform}}
      - {name: default, route: small}
    tests:
"""

CASES = [
    # (case, passes, message)
    ("{answers: {jailbreak: 0.95}, expect: {rule: guard, block: true}}", True, ""),
    ("{answers: {jailbreak: 0.95}, expect: {block: 403}}", True, ""),
    ("{answers: {jailbreak: 0.1, kind: code, difficulty: hard}, expect: {route: large}}", True, ""),
    ("{answers: {jailbreak: 0.1, kind: code, difficulty: 2}, expect: {route: [large, small]}}", True, ""),
    (
        "{answers: {jailbreak: 0.1, kind: code, difficulty: 2}, expect: {tags: {x-team: platform}, set: {effort: high}}}",
        True,
        "",
    ),
    ("{answers: {jailbreak: 0.1, kind: chat}, expect: {rule: default, block: false}}", True, ""),
    (
        "{engine_error: true, expect: {rule: on_engine_error, route: small, degraded: true, tags: {x-degraded: '1'}}}",
        True,
        "",
    ),
    (
        "{answers: {jailbreak: 0.1, kind: chat}, expect: {rule: guard}}",
        False,
        "expected rule 'guard', got 'default'; trace: guard (no), hard (no), default",
    ),
    (
        "{answers: {jailbreak: 0.95}, expect: {route: small}}",
        False,
        "expected a route to 'small', got a block (403); trace: guard (matched)",
    ),
    (
        "{answers: {jailbreak: 0.1, kind: code, difficulty: 2}, expect: {route: [large]}}",
        False,
        "expected a route to 'large', got 'large' -> 'small'; trace: guard (no), hard (matched)",
    ),
    (
        "{answers: {jailbreak: 0.1, kind: chat}, expect: {block: true}}",
        False,
        "expected a block, got a route; trace: guard (no), hard (no), default",
    ),
    (
        "{answers: {jailbreak: 0.95}, expect: {block: 451}}",
        False,
        "expected block status 451, got 403; trace: guard (matched)",
    ),
    (
        "{answers: {jailbreak: 0.95}, expect: {block: false}}",
        False,
        "expected no block, got a block; trace: guard (matched)",
    ),
    (
        "{answers: {jailbreak: 0.1, kind: code, difficulty: 2}, expect: {tags: {x-team: infra, x-other: a}}}",
        False,
        "expected tag 'x-team'='infra', got 'platform'; expected tag 'x-other'='a', it is not set;"
        " trace: guard (no), hard (matched)",
    ),
    (
        "{answers: {jailbreak: 0.1, kind: code, difficulty: 2}, expect: {set: {effort: low}}}",
        False,
        "expected set 'effort'='low', got 'high'; trace: guard (no), hard (matched)",
    ),
    (
        "{answers: {jailbreak: 0.1, kind: chat}, expect: {degraded: true}}",
        False,
        "expected degraded=true, got false; trace: guard (no), hard (no), default",
    ),
    (
        "{answers: {jailbreak: 0.1}, expect: {rule: default}}",
        False,
        "rule 'hard' of policy 'auto' reads 'kind', which has no answer; give it in `answers`",
    ),
]


@pytest.mark.parametrize(("case", "passes", "message"), CASES)
def test_policy_test_case(case: str, passes: bool, message: str) -> None:
    config = parse_config(CONFIG + f"      - {case}\n")
    (test,) = config.tests
    result = run_test(config.policies[test.policy], test)
    assert (result.passed, result.message) == (passes, message)


def test_case_label_and_line() -> None:
    config = parse_config(
        CONFIG + "      - {name: guarded, answers: {jailbreak: 1}, expect: {block: true}}\n", "c.yaml"
    )
    (test,) = config.tests
    assert test.label == "auto #1 'guarded'"
    assert test.line == 18


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "{answers: {kind: maths}, expect: {rule: default}}",
            "c.yaml:18:20: policies.auto.tests[0].answers.kind: unknown option 'maths'; expected one of 'code', 'chat'",
        ),
        (
            "{expect: {route: nowhere}}",
            "c.yaml:18:19: policies.auto.tests[0].expect.route: unknown upstream 'nowhere'",
        ),
        (
            "{expect: {route: small, block: 403}}",
            "c.yaml:18:10: policies.auto.tests[0].expect: `expect` cannot want both a route and a block",
        ),
        (
            "{answers: {kind: code}}",
            "c.yaml:18:9: policies.auto.tests[0]: missing required key 'expect'",
        ),
    ],
)
def test_invalid_test_case(case: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIG + f"      - {case}\n", "c.yaml")
    assert str(info.value) == message
