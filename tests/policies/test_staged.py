"""`ask: staged` at load time and in the walk: the stages, the pause, and decisions equal to `together`'s."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from d3backend import Answer, answer_from
from policies import ConfigError, Policy, load_config, parse_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "replay.yaml"

CONFIG = """
upstreams:
  small: {{url: http://127.0.0.1:8001/v1}}
  large: {{url: http://127.0.0.1:8002/v1}}
policies:
  auto:
    ask: {ask}
    questions:
      pii: {{type: noul}}
      jailbreak: {{type: noul}}
      kind: {{type: choice, criteria: {{code: null, chat: null}}}}
      difficulty: {{type: score, criteria: [easy, hard]}}
    rules:
      - {{name: tag-pii, when: pii > 0.5, tag: {{x-pii: "yes"}}, set: {{store: false}}}}
      - {{name: guard, when: jailbreak > 0.9 or pii > 0.99, block: {{status: 451, message: No.}}}}
      - {{name: team, tag: {{x-team: platform}}}}
      - {{name: code, when: kind == "code" and difficulty > 0.5, route: large, set: {{store: true}}}}
      - {{name: code-tag, when: kind == "code", tag: {{x-code: "1"}}}}
      - {{name: default, route: small}}
"""

GRID: dict[str, list[Any]] = {
    "pii": [0.1, 0.7, 0.995],
    "jailbreak": [0.02, 0.95],
    "kind": ["code", "chat"],
    "difficulty": [0, 1],
}


def policy(ask: str) -> Policy:
    return parse_config(CONFIG.format(ask=ask), "c.yaml").policies["auto"]


def example(ask: str) -> Policy:
    together = load_config(EXAMPLE).policies["auto"]
    return together if ask == "together" else dataclasses.replace(together, ask="staged")


def tables(policy: Policy, grid: Mapping[str, list[Any]]) -> list[dict[str, Answer]]:
    names = list(grid)
    return [
        {qid: answer_from(policy.questions[qid], value) for qid, value in zip(names, values, strict=True)}
        for values in itertools.product(*(grid[qid] for qid in names))
    ]


def test_together_is_the_default_and_asks_once() -> None:
    together = load_config(EXAMPLE).policies["auto"]
    assert together.ask == "together"
    assert [list(stage) for stage in together.stages] == [["jailbreak", "injection", "kind", "difficulty"]]


def test_staged_asks_the_guards_questions_first() -> None:
    assert [list(stage) for stage in example("staged").stages] == [["jailbreak"], ["injection", "kind", "difficulty"]]
    # The tag rule before the guard, and both names the guard reads, are in the first stage.
    assert [list(stage) for stage in policy("staged").stages] == [["pii", "jailbreak"], ["kind", "difficulty"]]


@pytest.mark.parametrize(
    ("guard", "stages"),
    [
        ("jailbreak > kind.code", [["pii", "jailbreak", "kind"], ["difficulty"]]),
        ("jailbreak > difficulty", [["pii", "jailbreak", "difficulty"], ["kind"]]),
        (
            "jailbreak > difficulty or kind.code > 0.5",
            [["pii", "jailbreak", "kind", "difficulty"]],
        ),  # one stage: together
    ],
)
def test_the_first_stage_is_what_the_rules_up_to_the_first_ending_one_read(guard: str, stages: list[list[str]]) -> None:
    config = CONFIG.format(ask="staged").replace("when: jailbreak > 0.9 or pii > 0.99", f"when: {guard}")
    assert [list(stage) for stage in parse_config(config).policies["auto"].stages] == stages


def test_ask_takes_together_or_staged() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^c\.yaml:7:5: policies\.auto\.ask: expected one of 'together' or 'staged', found 'sometimes'$",
    ):
        policy("sometimes")


def test_walk_pauses_where_an_answer_is_missing() -> None:
    staged = policy("staged")
    first = {
        "pii": answer_from(staged.questions["pii"], 0.7),
        "jailbreak": answer_from(staged.questions["jailbreak"], 0.02),
    }
    assert staged.walk({}) is None
    assert staged.walk({"pii": first["pii"]}) is None  # the guard reads jailbreak too
    assert staged.walk(first) is None  # `code` reads the second stage
    blocked = staged.walk({**first, "jailbreak": answer_from(staged.questions["jailbreak"], 0.95)})
    assert blocked is not None and blocked.rule == "guard"
    assert blocked.tags == {"x-pii": "yes"} and blocked.params == {"store": False}


@pytest.mark.parametrize("make", [policy, example], ids=["tags-before-guard", "examples-replay"])
def test_staged_decides_as_together_for_every_outcome(make: Any) -> None:
    together, staged = make("together"), make("staged")
    grid: Mapping[str, list[Any]] = GRID if make is policy else {"jailbreak": [0.02, 0.95], "injection": [0.1, 0.9],
                                        "kind": ["code", "math", "chat"], "difficulty": [0, 1, 2, 3]}  # fmt: skip
    outcomes: dict[str, int] = {}
    for answers in tables(together, grid):
        expected = together.evaluate(answers)
        first = {qid: answers[qid] for qid in staged.stages[0]}
        decision = staged.walk(first)
        if decision is None:
            decision = staged.walk(answers)
            outcomes["two stages"] = outcomes.get("two stages", 0) + 1
        else:
            outcomes["one stage"] = outcomes.get("one stage", 0) + 1
        assert decision == expected  # rule, action, tags, params and the trace
        outcomes[expected.rule] = outcomes.get(expected.rule, 0) + 1
    # Every rule that ends a walk was reached, and both ways of ending: the comparison covered every outcome.
    assert {rule.name for rule in together.rules if rule.action is not None} <= outcomes.keys()
    assert outcomes["one stage"] and outcomes["two stages"]


def test_replace_recomputes_the_stages() -> None:
    staged = policy("staged")
    assert len(dataclasses.replace(staged, ask="together").stages) == 1
