"""Configuration errors: their wording, their place in the file and their order, pinned where mutmut found a change
no test noticed (benchmarks/results/mutation.md, "not killed yet"). Also the results of policy tests and the
YAML reader's own errors."""

from __future__ import annotations

import dataclasses

import pytest

from policies import ConfigError, Policy, parse_config, run_test
from policies._errors import Issue
from policies._issues import _message, _short, by_line, locate

UP = "upstreams: {small: {url: http://small.test/v1}}\n"
DEFAULT = "rules: [{name: default, route: small}]"


def issues(text: str, file: str = "c.yaml") -> list[Issue]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file)
    return list(caught.value.issues)


def messages(text: str) -> list[str]:
    return [issue.message for issue in issues(text)]


def test_a_text_without_a_file_name_is_called_config_in_its_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("upstreams: []")
    assert str(caught.value).startswith("<config>:1:1: upstreams: ")
    assert caught.value.issues[0].file == "<config>"


def test_a_policy_with_an_issue_is_not_built_so_its_test_cases_are_not_checked() -> None:
    # The unknown upstream makes the policy unbuildable; its test case (an unknown question) is not looked at.
    text = UP + (
        "policies:\n  p:\n"
        "    rules: [{name: a, when: 'true', route: nowhere}, {name: default, route: small}]\n"
        "    tests: [{answers: {ghost: 0.5}, expect: {route: small}}]\n"
    )
    assert messages(text) == ["unknown upstream 'nowhere'; expected one of 'small' (see `upstreams`)"]


def test_an_expected_route_with_block_false_is_consistent_and_with_a_status_is_not() -> None:
    base = UP + "policies:\n  p:\n    " + DEFAULT + "\n    tests: [{expect: {route: small, block: %s}}]\n"
    assert len(parse_config(base % "false", "c.yaml").tests) == 1
    for block in ("true", "403"):
        assert messages(base % block) == ["`expect` cannot want both a route and a block"]


def test_unknown_answers_name_every_declared_question_and_each_is_reported() -> None:
    text = UP + (
        "policies:\n  p:\n"
        "    questions: {j: {type: noul}, k: {type: noul}}\n"
        "    rules: [{name: a, when: j > 0.5 and k > 0.5, block: {status: 403}}, {name: default, route: small}]\n"
        "    tests: [{answers: {x: 0.1, y: 0.2}, expect: {route: small}}]\n"
    )
    assert messages(text) == [
        "unknown question 'x'; expected one of 'j', 'k'",
        "unknown question 'y'; expected one of 'j', 'k'",
    ]


def test_an_unknown_answer_in_a_policy_without_questions_says_none() -> None:
    text = UP + "policies:\n  p:\n    " + DEFAULT + "\n    tests: [{answers: {x: 0.1}, expect: {route: small}}]\n"
    assert messages(text) == ["unknown question 'x'; expected one of none"]


def test_a_missing_key_does_not_hide_the_errors_after_it() -> None:
    # pydantic reports `upstreams` before `policies`: the missing key comes first.
    text = "upstreams: {a: {}}\npolicies: {p: {rules: 3}}\n"
    found = issues(text)
    assert [(i.path, i.message) for i in found] == [
        (("upstreams", "a"), "missing required key 'url'"),
        (("policies", "p", "rules"), "expected a list, found 3"),
    ]


def test_several_missing_keys_of_one_object_are_joined_in_one_message() -> None:
    # The schema has no object with two required keys a file can leave out together (a question's `type` picks its
    # model first), so the joining is pinned on the function itself.
    assert _message([("missing", "missing required key 'a'"), ("missing", "missing required key 'b'")]) == (
        "missing required key 'a'; missing required key 'b'"
    )


def test_an_unknown_key_written_in_capitals_is_placed_on_its_own_line() -> None:
    text = UP + "policies:\n  p:\n    " + DEFAULT + "\n    state:\n      FROM: last_user\n"
    (issue,) = issues(text)
    assert issue.path == ("policies", "p", "state", "FROM")
    assert (issue.line, issue.column) == (6, 7)


def test_an_issue_on_a_key_the_file_does_not_hold_is_placed_at_its_nearest_parent() -> None:
    marks = {(): (1, 1), ("a",): (2, 3), ("a", "b"): (3, 5)}
    assert locate(("a", "b", "c", "d"), marks) == (3, 5)
    assert locate(("a", "x"), marks) == (2, 3)
    assert locate(("z",), marks) == (1, 1)
    assert locate(("z",), {}) == (None, None)


def test_issues_sort_by_line_then_column_and_file_level_ones_first() -> None:
    def at(line: int | None, column: int | None) -> Issue:
        return Issue("c.yaml", line, column, (), f"{line}:{column}")

    # A missing line or column sorts before 1: given after the located issue of line 1 / column 1, it still goes first.
    ordered = by_line([at(3, 1), at(2, 9), at(1, None), at(None, None), at(2, 1), at(2, None)])
    assert [issue.message for issue in ordered] == ["None:None", "1:None", "2:None", "2:1", "2:9", "3:1"]


def test_found_values_are_cut_after_sixty_characters() -> None:
    assert _short("x" * 58) == repr("x" * 58)  # 60 characters with its quotes: whole
    assert _short("x" * 59) == repr("x" * 59)[:57] + "..."  # 61: cut to 57 and an ellipsis
    assert len(_short("x" * 500)) == 60


def test_a_test_result_carries_its_case_and_its_decision() -> None:
    text = UP + (
        "policies:\n  p:\n"
        "    questions: {j: {type: noul}}\n"
        "    rules: [{name: guard, when: j > 0.5, block: {status: 403}}, {name: default, route: small}]\n"
        "    tests: [{answers: {j: 0.9}, expect: {block: 403}}, {expect: {route: small}}]\n"
    )
    config = parse_config(text, "c.yaml")
    policy = config.policies["p"]
    passing = run_test(policy, config.tests[0])
    assert passing.test is config.tests[0]
    assert passing.decision is not None and passing.decision.rule == "guard" and passing.decision.policy == "p"
    missing = run_test(policy, config.tests[1])  # no answer for `j`: the evaluation fails, no decision
    assert missing.test is config.tests[1]
    assert missing.decision is None and not missing.passed


def test_a_policy_built_without_a_default_rule_says_so_when_nothing_matches() -> None:
    policy = parse_config(UP + "policies:\n  p:\n    questions: {j: {type: noul}}\n    rules: ["
                          "{name: guard, when: j > 0.5, block: {status: 403}}, {name: default, route: small}]\n",
                          "c.yaml").policies["p"]  # fmt: skip
    bare: Policy = dataclasses.replace(policy, rules=policy.rules[:1])
    from d3backend import NoulAnswer
    from policies import EvaluationError

    with pytest.raises(EvaluationError, match=r"^policy 'p' has no default route$"):
        bare.evaluate({"j": NoulAnswer(0.1, 1.0)})


def test_a_duplicate_key_inside_a_list_item_is_reported_at_its_path() -> None:
    text = UP + "policies:\n  p:\n    rules:\n      - {name: a, name: b, route: small}\n"
    (issue,) = issues(text)
    assert issue.path == ("policies", "p", "rules", 0, "name")
    assert (issue.line, issue.column) == (5, 19)
    assert issue.message == "duplicate key 'name' (first at line 5); keep one"


def test_merge_keys_are_not_duplicates() -> None:
    text = (
        "base: &base {url: http://small.test/v1}\n"
        "upstreams:\n  small: {<<: *base, <<: *base}\n"
        "policies:\n  p:\n    " + DEFAULT + "\n"
    )
    found = messages(text)
    assert not any("duplicate" in message for message in found)


def test_a_reader_error_without_a_mark_names_the_file_and_no_place() -> None:
    (issue,) = issues("upstreams: \x07\n", "bad.yaml")
    assert (issue.file, issue.path) == ("bad.yaml", ())
    assert issue.message.startswith("invalid YAML: ")


def test_the_depth_error_names_the_character_and_leaves_the_source_out() -> None:
    # `not`s, not parentheses: mutmut's trampolines run out of stack on 65 parentheses before the limit is reached.
    from d3backend import Noul
    from policies import ExpressionError, compile_condition

    source = "not " * 65 + "j > 0.9"
    with pytest.raises(ExpressionError) as caught:
        compile_condition(source, {"j": Noul(None)})
    message = (
        "the condition nests deeper than 64 levels (at character 257); use fewer parentheses, `not`s or brackets,"
        " e.g. `a and b and c` needs none"
    )
    assert (str(caught.value), caught.value.message) == (message, message)
    assert (caught.value.source, caught.value.pos) == (source, 256)


def test_a_parameter_some_apis_cannot_take_names_them_and_the_apis_that_can() -> None:
    text = UP + "policies:\n  p:\n    rules: [{name: default, route: small, set: {reasoning_effort: high}}]\n"
    (issue,) = issues(text)
    assert issue.path == ("policies", "p", "rules", 0, "set", "reasoning_effort")
    assert issue.message == (
        "`set` 'reasoning_effort' has no equivalent in the Completions (/v1/completions) or Anthropic Messages"
        " (/v1/messages) API; limit the policy's `apis` to those that take it, e.g. `apis: [chat, responses]`"
    )


def test_a_parameter_none_of_the_policys_apis_can_take_says_to_remove_it() -> None:
    text = UP + "policies:\n  p:\n    apis: [messages]\n    rules: [{name: default, route: small, set: {seed: 1}}]\n"
    assert messages(text) == [
        "`set` 'seed' has no equivalent in the Anthropic Messages (/v1/messages) API; limit the policy's `apis` to"
        " those that take it, or remove it"
    ]


@pytest.mark.parametrize(
    ("policies", "known"),
    [("policies: {p: {" + DEFAULT + "}, q: {" + DEFAULT + "}}", "'p', 'q'"), ("", "none")],
)
def test_an_unknown_default_policy_names_the_known_ones(policies: str, known: str) -> None:
    (issue,) = issues(UP + "server: {default_policy: nope}\n" + policies + "\n")
    assert issue.path == ("server", "default_policy")
    assert issue.message == f"unknown policy 'nope'; expected one of {known}"


def test_a_parameter_the_fallback_cannot_send_is_placed_under_on_engine_error() -> None:
    text = UP + (
        "policies:\n  p:\n    apis: [messages]\n    on_engine_error: {route: small, set: {seed: 1}}\n    "
        + DEFAULT
        + "\n"
    )
    (issue,) = issues(text)
    assert issue.path == ("policies", "p", "on_engine_error", "set", "seed")


def test_every_duplicate_key_of_a_mapping_is_reported_not_only_the_first() -> None:
    text = UP + "policies: {}\npolicies: {}\nengine: {}\nengine: {}\n"
    assert messages(text) == [
        "duplicate key 'policies' (first at line 2); keep one",
        "duplicate key 'engine' (first at line 4); keep one",
    ]


def test_a_yaml_error_without_a_position_is_reported_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyyaml's errors normally carry a mark; one without (built here) is still one clear issue, with no position."""
    import yaml

    from policies import _yaml

    def fail(self: object) -> None:
        raise yaml.MarkedYAMLError(problem="could not read it")

    monkeypatch.setattr(_yaml._Loader, "get_single_node", fail)
    with pytest.raises(ConfigError) as info:
        _yaml.load_yaml("a: 1\n", "f.yaml")
    [issue] = info.value.issues
    assert (issue.line, issue.column, issue.message) == (None, None, "invalid YAML: could not read it")
