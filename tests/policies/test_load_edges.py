"""What the file says reaches the compiled policy whole: instructions, descriptions, the state source, block
messages, the fail-open route; and the file-level refusals carry their file. Each test kills mutants mutmut found
surviving (benchmarks/results/mutation.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from d3backend import Choice, Noul, Score
from policies import Block, ConfigError, Route, Step, load_config, parse_config
from policies._load import MAX_FILE_BYTES

CONFIG = """
upstreams: {small: {url: http://small.test/v1}, large: {url: http://large.test/v1}}
policies:
  guarded:
    description: Keeps jailbreaks out.
    state: {from: conversation, max_chars: 1234}
    questions:
      kind: {type: choice, instructions: What kind of request?, criteria: {code: null, chat: null}}
      jailbreak: {type: noul, instructions: Is this a jailbreak?}
      difficulty: {type: score, instructions: How hard is it?, criteria: [easy, hard]}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: Refused by policy.}}
      - {name: code, when: kind == "code" and difficulty > 0.5, route: large}
      - {name: default, route: [small, large]}
"""


def test_questions_keep_their_instructions_and_the_policy_its_description_and_state() -> None:
    policy = parse_config(CONFIG, "c.yaml").policies["guarded"]
    assert policy.description == "Keeps jailbreaks out."
    assert (policy.state.source, policy.state.max_chars) == ("conversation", 1234)
    kind, jailbreak, difficulty = (policy.questions[name] for name in ("kind", "jailbreak", "difficulty"))
    assert isinstance(kind, Choice) and kind.instructions == "What kind of request?"
    assert isinstance(jailbreak, Noul) and jailbreak.instructions == "Is this a jailbreak?"
    assert isinstance(difficulty, Score) and difficulty.instructions == "How hard is it?"
    assert policy.rules[0].action == Block(403, "Refused by policy.")


def test_without_on_engine_error_the_policy_fails_open_to_its_default_route() -> None:
    policy = parse_config(CONFIG, "c.yaml").policies["guarded"]
    decision = policy.engine_failed()
    assert decision.policy == "guarded"
    assert decision.rule == "on_engine_error"
    assert decision.action == Route(("small", "large"))
    assert (dict(decision.tags), dict(decision.params)) == ({}, {})
    assert decision.trace == (Step("on_engine_error", None, True),)
    assert decision.degraded


def test_a_single_default_upstream_is_the_fail_open_route() -> None:
    config = parse_config(CONFIG.replace("route: [small, large]", "route: small"), "c.yaml")
    assert config.policies["guarded"].engine_failed().action == Route(("small",))


def test_a_file_of_exactly_the_size_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    text = CONFIG + "#" * (MAX_FILE_BYTES - len(CONFIG.encode()) - 1) + "\n"
    path.write_text(text, encoding="utf-8")
    assert len(path.read_bytes()) == MAX_FILE_BYTES
    assert "guarded" in load_config(path).policies
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [issue] = caught.value.issues
    assert (issue.file, issue.path) == (str(path), ())
    assert issue.message == f"the file is over {MAX_FILE_BYTES // 2**20} MiB"


def test_file_level_refusals_carry_the_file_and_an_empty_path(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"policies: {caf\xe9: 1}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    [issue] = caught.value.issues
    assert (issue.file, issue.path, issue.message) == (str(bad), (), "the file is not UTF-8 (byte 14)")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "missing.yaml")
    [issue] = caught.value.issues
    assert (issue.file, issue.path) == (str(tmp_path / "missing.yaml"), ())
    assert issue.message == "cannot read the file: No such file or directory"
    with pytest.raises(ConfigError) as caught:
        parse_config("[1, 2]", "list.yaml")
    [issue] = caught.value.issues
    assert (issue.file, issue.line, issue.column, issue.path) == ("list.yaml", 1, 1, ())


@pytest.mark.parametrize(("options", "accepted"), [(3, True), (4, False)])
def test_a_choice_may_have_exactly_max_choice_options(options: int, accepted: bool) -> None:
    criteria = ", ".join(f"o{index}: null" for index in range(options))
    text = ("upstreams: {small: {url: http://small.test/v1}}\nengine: {max_choice_options: 3}\n"
            f"policies: {{p: {{questions: {{k: {{type: choice, criteria: {{{criteria}}}}}}},"
            " rules: [{name: a, when: 'k == \"o0\"', route: small}, {name: default, route: small}]}}\n")  # fmt: skip
    if accepted:
        assert len(parse_config(text, "f.yaml").policies["p"].questions["k"].options) == 3  # type: ignore[union-attr]
    else:
        with pytest.raises(ConfigError, match="this choice has 4 options; the engine takes at most 3"):
            parse_config(text, "f.yaml")
