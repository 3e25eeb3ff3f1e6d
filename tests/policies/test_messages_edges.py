"""The exact words of configuration errors: bounds, empty strings, what was found (null, booleans, mappings, long
values cut short), several issues on their own lines, file-level YAML errors. Each test kills mutants mutmut found
surviving (benchmarks/results/mutation.md)."""

from __future__ import annotations

import pytest

from policies import ConfigError, parse_config

U = "upstreams: {small: {url: http://small.test/v1}}\n"
P = "policies: {p: {rules: [{name: default, route: small}]}}\n"
LONG = "x" * 80


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (U + "engine: {max_choice_options: 1}\n" + P, "f.yaml:2:10: engine.max_choice_options: expected a number at least 2, found 1"),
        (U + "engine: {embedded: {model: ''}}\n" + P, "f.yaml:2:21: engine.embedded.model: expected a non-empty string, found ''"),
        ("upstreams: null\n" + P, "f.yaml:1:1: upstreams: expected a mapping, found null"),
        ("upstreams: true\n" + P, "f.yaml:1:1: upstreams: expected a mapping, found true"),
        (U + "policies: {p: {rules: {name: default}}}\n", "f.yaml:2:16: policies.p.rules: expected a list, found a mapping"),
        (U + f"server: {{max_body_bytes: {LONG}}}\n" + P, f"f.yaml:2:10: server.max_body_bytes: expected a whole number, found '{'x' * 56}..."),
        ("upstreams: {small: {url: ftp://x}, big: {url: ftp://y}}\n" + P,
         "f.yaml:1:21: upstreams.small.url: expected an http(s) URL, found 'ftp://x'\n"
         "f.yaml:1:42: upstreams.big.url: expected an http(s) URL, found 'ftp://y'"),
        ("upstreams: {small: {url: http://s.test/v1, api_key_env: 'bad name'}}\n" + P,
         "f.yaml:1:44: upstreams.small.api_key_env: expected the name of an environment variable (not the key itself),"
         " found a value that is not a name"),
    ],
)  # fmt: skip
def test_messages(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "f.yaml")
    assert str(caught.value) == expected


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("", 1, None, "the file is empty; expected a mapping with `policies`"),
        ("policies: [\n", 2, 1, "invalid YAML: while parsing a flow node did not find expected node content"),
        ("[1, 2]", 1, 1, "expected a mapping with `upstreams` and `policies`, found a list"),
    ],
)
def test_file_level_issues_have_an_empty_path(text: str, line: int, column: int | None, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "f.yaml")
    [issue] = caught.value.issues
    assert (issue.file, issue.line, issue.column, issue.path, issue.message) == ("f.yaml", line, column, (), message)
