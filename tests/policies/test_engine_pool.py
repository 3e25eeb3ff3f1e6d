"""`engine.pool` (issue 28.2): remote and decisions engines tried in order, checked at load."""

from __future__ import annotations

import pytest

from policies import ConfigError, parse_config

POLICY = """upstreams: {small: {url: "http://small.test/v1"}}
policies:
  auto:
    questions:
      kind: {type: choice, criteria: {a: null, b: null, c: null}}
    rules:
      - {name: default, route: small}
"""
POOL = """engine:
  pool:
    - remote: {urls: ["http://d3:8000"], timeout_s: 1}
    - decisions: {url: "http://luna.test/v1", model: luna, timeout_s: 2}
"""


def test_a_pool_of_both_kinds_loads_in_order() -> None:
    config = parse_config(POOL + POLICY)
    pool = config.engine.pool
    assert config.engine.kind == "pool" and pool is not None
    assert [(m.label, m.kind, m.worst_s, m.set_aside_s) for m in pool] == [
        ("remote", "remote", 1.0, 5.0),
        ("decisions", "decisions", 2.0, 5.0),
    ]


def test_a_pool_is_one_kind_of_engine() -> None:
    with pytest.raises(ConfigError, match=r"^<config>:1:1: engine: set one engine kind \(embedded, remote, decisions"
                                          r" or pool\), found remote and pool$"):  # fmt: skip
        parse_config(POOL.replace("engine:\n", "engine:\n  remote: {urls: ['http://d3:8000']}\n") + POLICY)


@pytest.mark.parametrize(
    ("entry", "found"),
    [("{name: x}", "none"), ("{remote: {urls: ['http://d3:8000']}, decisions: {url: 'http://l.test/v1', model: l}}",
                             "remote and decisions")],
    ids=["none", "two"],
)  # fmt: skip
def test_each_pool_engine_is_one_kind(entry: str, found: str) -> None:
    text = f"engine:\n  pool:\n    - {entry}\n" + POLICY
    with pytest.raises(ConfigError, match=rf"^<config>:3:7: engine.pool\[0\]: set one engine kind for a pool's engine"
                                          rf" \(remote or decisions\), found {found}$"):  # fmt: skip
        parse_config(text)


def test_pool_engines_have_distinct_names() -> None:
    text = POOL.replace("    - decisions: {url", "    - remote: {urls: ['http://d3-b:8000']}\n    - decisions: {url")
    with pytest.raises(ConfigError, match=r"^<config>:4:7: engine.pool\[1\]: two of the pool's engines are called"
                                          r" 'remote' \(engine.pool\[0\] and \[1\]\); give each a distinct `name`$"):  # fmt: skip
        parse_config(text + POLICY)
    named = text.replace("['http://d3-b:8000']}", "['http://d3-b:8000']}\n      name: d3-b")
    assert [m.label for m in parse_config(named + POLICY).engine.pool or ()] == ["remote", "d3-b", "decisions"]


def test_a_first_engine_that_uses_up_the_decision_timeout_is_an_error() -> None:
    text = POOL.replace("timeout_s: 1}", "timeout_s: 3, urls: ['http://d3-a:8000', 'http://d3-b:8000']}")
    text = text.replace('urls: ["http://d3:8000"], ', "")
    with pytest.raises(ConfigError, match=r"^<config>:3:16: engine.pool\[0\].remote.timeout_s: the pool's engines up to"
                                          r" 'remote' may take 6 s \(a remote engine's try and its retry\), which uses"
                                          r" up server.decision_timeout_s \(5 s\): engine.pool\[1\] would never"
                                          r" answer; lower timeout_s or raise server.decision_timeout_s$"):  # fmt: skip
        parse_config(text + POLICY)
    parse_config(text + "server: {decision_timeout_s: 8}\n" + POLICY)  # the budget leaves the next one time


def test_a_choice_is_checked_against_each_pool_engine() -> None:
    text = POOL.replace("model: luna, timeout_s: 2}", "model: luna, timeout_s: 2}\n      max_choice_options: 2")
    with pytest.raises(ConfigError, match=r"^<config>:10:28: policies.auto.questions.kind.criteria: this choice has 3"
                                          r" options; the pool's engine 'decisions' takes at most 2"
                                          r" \(engine.pool\[1\].max_choice_options\)$"):  # fmt: skip
        parse_config(text + POLICY)
    parse_config(text.replace("max_choice_options: 2", "max_choice_options: 3") + POLICY)
