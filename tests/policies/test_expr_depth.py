"""Issue 19.7: a `when` nested thousands deep is a one-line configuration error, never a RecursionError.

The depth limit covers every way the grammar recurses (parentheses, `not`, list brackets), and long `and`/`or`
chains evaluate flat, so a condition that loads can never overflow the stack when a request is decided.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from d3backend import Noul, NoulAnswer, Question
from policies import ConfigError, ExpressionError, compile_condition, load_config
from policies._expr import MAX_EXPRESSION_DEPTH
from router._cli.main import main

QUESTIONS: dict[str, Question] = {"jailbreak": Noul(None)}
YES = {"jailbreak": NoulAnswer(0.95, 0.95)}
NO = {"jailbreak": NoulAnswer(0.05, 0.95)}


def config_text(when: str) -> str:
    return f"""upstreams:
  small: {{url: "http://127.0.0.1:9/v1"}}
policies:
  auto:
    questions:
      jailbreak: {{type: noul}}
    rules:
      - name: guard
        when: '{when}'
        block: {{status: 403, message: no}}
      - {{name: default, route: small}}
"""


DEEP = {
    "parentheses": "(" * 5000 + "jailbreak > 0.9" + ")" * 5000,
    "not": "not " * 5000 + "jailbreak > 0.9",
    "lists": "[" * 5000,
}


def test_the_limit_is_64() -> None:
    assert MAX_EXPRESSION_DEPTH == 64


@pytest.mark.parametrize("source", DEEP.values(), ids=DEEP.keys())
def test_deep_conditions_are_refused(source: str) -> None:
    with pytest.raises(ExpressionError, match=r"^the condition nests deeper than 64 levels \(at character \d+"):
        compile_condition(source, QUESTIONS)


@pytest.mark.parametrize("kind", ["(", "not "])
def test_64_levels_are_accepted_and_65_refused(kind: str) -> None:
    def nested(depth: int) -> str:
        return kind * depth + "jailbreak > 0.9" + (")" * depth if kind == "(" else "")

    condition, _ = compile_condition(nested(64), QUESTIONS)
    assert condition(YES) is True  # 64 `not`s cancel out
    with pytest.raises(ExpressionError, match="nests deeper than 64"):
        compile_condition(nested(65), QUESTIONS)


def test_the_depth_error_is_one_line_even_for_a_long_condition() -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_condition(DEEP["parentheses"], QUESTIONS)
    text = str(caught.value)
    assert "\n" not in text
    assert len(text) < 200
    assert caught.value.pos == 64


@pytest.mark.parametrize("op", ["and", "or"])
def test_long_chains_evaluate_without_recursion(op: str) -> None:
    condition, names = compile_condition(f" {op} ".join(["jailbreak > 0.9"] * 5000), QUESTIONS)
    assert names == {"jailbreak"}
    assert condition(YES) is True
    assert condition(NO) is False


@pytest.mark.parametrize(
    ("source", "yes", "no"),
    [
        ("jailbreak > 0.9 and jailbreak > 0.5 and jailbreak < 0.99", True, False),
        ("jailbreak < 0.1 or jailbreak > 0.99 or jailbreak > 0.9", True, True),
        ("jailbreak > 0.9 and jailbreak < 0.5 or jailbreak < 0.1", False, True),
        ("jailbreak < 0.1 or jailbreak > 0.5 and jailbreak < 0.6", False, True),
    ],
)
def test_chains_keep_their_meaning(source: str, yes: bool, no: bool) -> None:
    condition, _ = compile_condition(source, QUESTIONS)
    assert (condition(YES), condition(NO)) == (yes, no)


@pytest.mark.parametrize("source", DEEP.values(), ids=DEEP.keys())
def test_load_config_reports_the_depth_at_file_line_col(tmp_path: Path, source: str) -> None:
    file = tmp_path / "deep.yaml"
    file.write_text(config_text(source))
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    [issue] = caught.value.issues
    assert (issue.line, issue.column) == (9, 9)
    assert re.fullmatch(
        rf"{re.escape(str(file))}:9:9: policies\.auto\.rules\[0\]\.when: rule 'guard': the condition nests deeper than 64 levels"
        r" \(at character \d+\); .*",
        str(issue),
    )


def test_check_prints_one_line_per_error_and_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "deep.yaml"
    file.write_text(config_text(DEEP["parentheses"]))
    assert main(["check", str(file)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        f"error: {file}:9:9: policies.auto.rules[0].when: rule 'guard': the condition nests deeper than 64"
    )
    assert lines[1] == f"{file}: invalid (1 error)"


def test_a_long_and_chain_loads_and_decides(tmp_path: Path) -> None:
    file = tmp_path / "chain.yaml"
    file.write_text(config_text(" and ".join(["jailbreak > 0.9"] * 3000)))
    policy = load_config(file).policies["auto"]
    assert policy.evaluate(YES).rule == "guard"
    assert policy.evaluate(NO).rule == "default"


def test_yaml_nested_too_deep_is_a_config_error(tmp_path: Path) -> None:
    file = tmp_path / "nested.yaml"
    file.write_text("upstreams:\n  " + "- " * 990 + "x\n")
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    [issue] = caught.value.issues
    assert str(issue).startswith(f"{file}: the file nests too deeply to read")
    assert (issue.path, issue.key, issue.line) == ((), "", None)  # the whole file, no key in it


@pytest.mark.parametrize(
    "before", ["not jailbreak > 0.9", "(jailbreak > 0.9)", '"a" in ["a"]'], ids=["not", "parentheses", "list"]
)
def test_a_closed_level_gives_its_depth_back(before: str) -> None:
    # `not`, a group and a list each leave the depth as they found it: 64 more levels after one are still allowed,
    # and 65 still refused (mutants of the parser's `depth -= 1`).
    compile_condition(f"{before} and " + "not " * 64 + "jailbreak > 0.9", QUESTIONS)
    with pytest.raises(ExpressionError, match=r"^the condition nests deeper than 64 levels"):
        compile_condition(f"{before} and " + "not " * 65 + "jailbreak > 0.9", QUESTIONS)


@pytest.mark.parametrize(
    ("last", "at"), [("(jailbreak > 0.9)", 257), ('"a" in ["a"]', 264), ("not jailbreak > 0.9", 257)]
)
def test_the_level_past_64_is_named_by_its_character(last: str, at: int) -> None:
    # 64 `not`s, then a group, a list or a 65th `not`: the refusal names the character that opened the 65th level.
    with pytest.raises(ExpressionError, match=rf"^the condition nests deeper than 64 levels \(at character {at}\);"):
        compile_condition("not " * 64 + last, QUESTIONS)
