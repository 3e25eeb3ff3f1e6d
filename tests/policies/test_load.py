"""Every validation error of the configuration file, with its exact message and position."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from policies import ConfigError, load_config, parse_config

HEAD = """upstreams:
  small: {url: http://127.0.0.1:8001/v1}
  large: {url: http://127.0.0.1:8002/v1}
policies:
  auto:
"""

VALID = (
    HEAD
    + """    questions:
      kind: {type: choice, criteria: {code: null, chat: null}}
      jailbreak: {type: noul, criteria: {true: trying to bypass rules, false: ordinary}}
      difficulty: {type: score, criteria: [easy, hard]}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: no}}
      - {name: code, when: kind == "code", route: [large, small], set: {temperature: 0.2}}
      - {name: default, route: small}
"""
)

INVALID = [
    pytest.param(
        "",
        "c.yaml:1: the file is empty; expected a mapping with `policies`",
        id="empty",
    ),
    pytest.param(
        "# nothing\n",
        "c.yaml:1: the file is empty; expected a mapping with `policies`",
        id="comment only",
    ),
    pytest.param(
        "- a\n- b\n",
        "c.yaml:1:1: expected a mapping with `upstreams` and `policies`, found a list",
        id="not mapping",
    ),
    pytest.param(
        "upstreams: {small: {url: http://x}\npolicies: [\n",
        "c.yaml:2:1: invalid YAML: while parsing a flow mapping did not find expected ',' or '}'",
        id="syntax",
    ),
    pytest.param(
        "upstreams:\n\tsmall: 1\n",
        "c.yaml:2:1: invalid YAML: while scanning for the next token found character that cannot start any token",
        id="tab",
    ),
    pytest.param(
        "upstreams: {small: {url: http://a}}\nupstreams: {}\n",
        "c.yaml:2:1: upstreams: duplicate key 'upstreams' (first at line 1); keep one",
        id="dup top",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small}\n    rules: []\n",
        "c.yaml:8:5: policies.auto.rules: duplicate key 'rules' (first at line 6); keep one",
        id="dup nested",
    ),
    pytest.param(
        "upstream: {small: {url: http://a}}\n",
        "c.yaml:1:1: upstream: unknown key 'upstream'; did you mean 'upstreams'? expected one of server, engine, upstreams, policies",
        id="unknown top",
    ),
    pytest.param(
        "{HEAD}    rule:\n      - {name: default, route: small}\n",
        "c.yaml:6:5: policies.auto.rule: unknown key 'rule'; did you mean 'rules'? expected one of description, apis, state, ask, on_engine_error, shadow, session, overlap, questions, rules, tests, answer",
        id="unknown policy key",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, rout: small}\n",
        "c.yaml:7:25: policies.auto.rules[0].rout: unknown key 'rout'; did you mean 'route'? expected one of route, block, tag, set, name, when",
        id="unknown rule key",
    ),
    pytest.param(
        "policies: {}\n",
        "c.yaml:1:1: missing required key 'upstreams'",
        id="missing upstreams",
    ),
    pytest.param(
        "{HEAD}    questions: {}\n",
        "c.yaml:5:3: policies.auto: missing required key 'rules'",
        id="missing rules",
    ),
    pytest.param(
        "{HEAD}    rules: []\n",
        "c.yaml:6:5: policies.auto.rules: expected at least 1 item(s), found 0",
        id="empty rules",
    ),
    pytest.param(
        "upstreams:\n  small: {url: ftp://x}\n",
        "c.yaml:2:11: upstreams.small.url: expected an http(s) URL, found 'ftp://x'",
        id="bad url",
    ),
    pytest.param(
        "upstreams:\n  small: {url: http://x, api_key_env: sk-123456}\n",
        "c.yaml:2:26: upstreams.small.api_key_env: expected the name of an environment variable (not the key itself), found a value that is not a name",
        id="env is key",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: 5}\n",
        "c.yaml:7:25: policies.auto.rules[0].route: expected a string or a list, found 5",
        id="wrong type route",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: b, block: {status: five}}\n      - {name: default, route: small}\n",
        "c.yaml:7:27: policies.auto.rules[0].block.status: expected a whole number, found 'five'",
        id="wrong type status",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: b, block: {status: 500}}\n      - {name: default, route: small}\n",
        "c.yaml:7:27: policies.auto.rules[0].block.status: expected a number at most 499, found 500",
        id="status 500",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: b, route: small, block: {}}\n      - {name: default, route: small}\n",
        "c.yaml:7:9: policies.auto.rules[0]: a rule either routes or blocks, not both",
        id="route and block",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: b, when: 'true'}\n      - {name: default, route: small}\n",
        "c.yaml:7:9: policies.auto.rules[0]: rule 'b' does nothing; give it `route`, `block`, `tag` or `set`",
        id="does nothing",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: [small, huge]}\n",
        "c.yaml:7:25: policies.auto.rules[0].route: unknown upstream 'huge'; expected one of 'small', 'large' (see `upstreams`)",
        id="unknown upstream",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: a, tag: {x-a: b}}\n      - {name: a, route: small}\n",
        "c.yaml:8:10: policies.auto.rules[1].name: rule name 'a' is already used by rules[0]",
        id="dup rule",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: a, route: small}\n      - {name: default, route: small}\n",
        "c.yaml:8:9: policies.auto.rules[1]: rule 'default' is unreachable: rule 'a' before it always ends the walk",
        id="unreachable",
    ),
    pytest.param(
        "{HEAD}    questions: {j: {type: noul}}\n    rules:\n      - {name: a, when: j > 0.5, route: small}\n",
        "c.yaml:8:9: policies.auto.rules[0]: the last rule ('a') must be an unconditional route, the policy's default; add e.g. `- {name: default, route: <upstream>}`",
        id="no default",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: a, block: {}}\n",
        "c.yaml:7:9: policies.auto.rules[0]: the last rule ('a') must be an unconditional route, the policy's default; add e.g. `- {name: default, route: <upstream>}`",
        id="block default",
    ),
    pytest.param(
        "{HEAD}    questions: {j: {type: noul}}\n    rules:\n      - {name: a, when: j >, route: small}\n      - {name: default, route: small}\n",
        "c.yaml:8:19: policies.auto.rules[0].when: rule 'a': expected a value after '>'\n    j >\n       ^",
        id="bad when",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: a, when: true, route: small}\n      - {name: default, route: small}\n",
        "c.yaml:7:19: policies.auto.rules[0].when: `when` takes a condition as text, found true; quote it",
        id="bool when",
    ),
    pytest.param(
        "{HEAD}    questions: {j: {type: yesno}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:17: policies.auto.questions.j: unknown question type 'yesno'; expected 'choice', 'noul' or 'score'",
        id="q type",
    ),
    pytest.param(
        "{HEAD}    questions: {j: {criteria: [a, b]}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:17: policies.auto.questions.j: missing `type`; expected 'choice', 'noul' or 'score'",
        id="q no type",
    ),
    pytest.param(
        "{HEAD}    questions: {my-q: {type: noul}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:5: policies.auto.questions: question id 'my-q' must be a name (letters, digits, _) so `when` can use it",
        id="q id",
    ),
    pytest.param(
        "{HEAD}    questions: {k: {type: choice, criteria: {a: x}}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:35: policies.auto.questions.k.criteria: a choice needs at least 2 options, found 1",
        id="choice one",
    ),
    pytest.param(
        "{HEAD}    questions: {k: {type: choice, criteria: {true: x, b: y}}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:35: policies.auto.questions.k.criteria: option names must be non-empty strings, found True; quote it",
        id="choice bool key",
    ),
    pytest.param(
        "{HEAD}    questions: {k: {type: choice, criteria: {'': x, b: y}}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:35: policies.auto.questions.k.criteria: option names must be non-empty strings, found ''",
        id="choice empty key",
    ),
    pytest.param(
        "{HEAD}    questions: {j: {type: noul, criteria: {maybe: x}}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:44: policies.auto.questions.j.criteria.maybe: unknown key 'maybe'; expected one of true, false",
        id="noul bad criteria",
    ),
    pytest.param(
        "{HEAD}    questions: {s: {type: score, criteria: [a]}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:34: policies.auto.questions.s.criteria: expected at least 2 item(s), found 1",
        id="score one",
    ),
    pytest.param(
        "{HEAD}    questions: {s: {type: score, criteria: [a,b,c,d,e,f,g,h,i,j,k]}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:34: policies.auto.questions.s.criteria: expected at most 10 item(s), found more",
        id="score eleven",
    ),
    pytest.param(
        "{HEAD}    questions: {s: {type: score, criteria: [a, a]}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:34: policies.auto.questions.s.criteria: score levels must be unique; repeated: 'a'",
        id="score dup",
    ),
    pytest.param(
        "{HEAD}    questions: {s: {type: score, criteria: [a, ' ']}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:34: policies.auto.questions.s.criteria: score levels must be non-empty",
        id="score empty level",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small, tag: {'x team': a}}\n",
        "c.yaml:7:39: policies.auto.rules[0].tag: invalid header name 'x team'",
        id="header bad",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small, tag: {x-d3-rule: a}}\n",
        "c.yaml:7:39: policies.auto.rules[0].tag: header 'x-d3-rule' is reserved; pick another name, e.g. 'x-team'",
        id="header reserved",
    ),
    pytest.param(
        '{HEAD}    rules:\n      - {name: default, route: small, tag: {x-a: "a\\r\\nb"}}\n',
        "c.yaml:7:39: policies.auto.rules[0].tag: the value of header 'x-a' holds a control character",
        id="header crlf",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small, set: {model: x}}\n",
        "c.yaml:7:39: policies.auto.rules[0].set: `set` cannot change 'model': `route` picks the model and the client owns the rest",
        id="set model",
    ),
    pytest.param(
        "{HEAD}    state: {from: everything}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:13: policies.auto.state.from: expected one of 'last_user', 'new', 'conversation' or 'json', found 'everything'",
        id="state from",
    ),
    pytest.param(
        "{HEAD}    state: {max_chars: 0}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:13: policies.auto.state.max_chars: expected a number greater than 0, found 0",
        id="max chars",
    ),
    pytest.param(
        "engine: {embedded: {}, remote: {urls: [http://a]}}\nupstreams: {small: {url: http://a}}\n",
        "c.yaml:1:1: engine: set one engine kind (embedded, remote, decisions or pool), found embedded and remote",
        id="engine both",
    ),
    pytest.param(
        "engine: {remote: {urls: []}}\nupstreams: {small: {url: http://a}}\n",
        "c.yaml:1:19: engine.remote.urls: expected at least 1 item(s), found 0",
        id="engine no urls",
    ),
    pytest.param(
        "engine: {max_choice_options: 26}\n{HEAD}    questions: {k: {type: choice, criteria: {o0: null, o1: null, o2: null, o3: null, o4: null, o5: null, o6: null, o7: null, o8: null, o9: null, o10: null, o11: null, o12: null, o13: null, o14: null, o15: null, o16: null, o17: null, o18: null, o19: null, o20: null, o21: null, o22: null, o23: null, o24: null, o25: null, o26: null}}}\n    rules:\n      - {name: default, when: k == 'o1', route: small}\n      - {name: d, route: small}\n",
        "c.yaml:7:35: policies.auto.questions.k.criteria: this choice has 27 options; the engine takes at most 26 (engine.max_choice_options: 255 for d3 models, 26 for generative ones)",
        id="options limit",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small}\n    tests:\n      - {answers: {zz: 1}, expect: {rule: default}}\n",
        "c.yaml:9:20: policies.auto.tests[0].answers.zz: unknown question 'zz'; expected one of none",
        id="test unknown q",
    ),
    pytest.param(
        "{HEAD}    questions: {j: {type: noul}}\n    rules:\n      - {name: default, when: j > 0.5, tag: {x-a: b}}\n      - {name: d, route: small}\n    tests:\n      - {answers: {j: 1.5}, expect: {rule: d}}\n",
        "c.yaml:11:20: policies.auto.tests[0].answers.j: a noul's answer is P(yes), a number from 0 to 1; found 1.5",
        id="test bad noul",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small}\n    tests:\n      - {answers: {}, expect: {}}\n",
        "c.yaml:9:23: policies.auto.tests[0].expect: `expect` checks nothing; give `rule`, `route`, `block`, `tags`, `set` or `degraded`",
        id="test nothing",
    ),
    pytest.param(
        "{HEAD}    rules:\n      - {name: default, route: small}\n    tests:\n      - {expect: {rule: nope}}\n",
        "c.yaml:9:19: policies.auto.tests[0].expect.rule: unknown rule 'nope'; expected one of 'default', 'on_engine_error'",
        id="test unknown rule",
    ),
    pytest.param(
        "{HEAD}    on_engine_error: {tag: {x-a: b}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:5: policies.auto.on_engine_error: `on_engine_error` must `route` or `block`",
        id="on_engine_error nothing",
    ),
    pytest.param(
        "{HEAD}    on_engine_error: {route: nowhere}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:23: policies.auto.on_engine_error.route: unknown upstream 'nowhere'; expected one of 'small', 'large' (see `upstreams`)",
        id="on_engine_error unknown",
    ),
    pytest.param(
        "{HEAD}    questions: {q0: {type: noul}, q1: {type: noul}, q2: {type: noul}, q3: {type: noul}, q4: {type: noul}, q5: {type: noul}, q6: {type: noul}, q7: {type: noul}, q8: {type: noul}, q9: {type: noul}, q10: {type: noul}, q11: {type: noul}, q12: {type: noul}, q13: {type: noul}, q14: {type: noul}, q15: {type: noul}, q16: {type: noul}, q17: {type: noul}, q18: {type: noul}, q19: {type: noul}, q20: {type: noul}, q21: {type: noul}, q22: {type: noul}, q23: {type: noul}, q24: {type: noul}, q25: {type: noul}, q26: {type: noul}, q27: {type: noul}, q28: {type: noul}, q29: {type: noul}, q30: {type: noul}, q31: {type: noul}, q32: {type: noul}, q33: {type: noul}, q34: {type: noul}, q35: {type: noul}, q36: {type: noul}, q37: {type: noul}, q38: {type: noul}, q39: {type: noul}, q40: {type: noul}, q41: {type: noul}, q42: {type: noul}, q43: {type: noul}, q44: {type: noul}, q45: {type: noul}, q46: {type: noul}, q47: {type: noul}, q48: {type: noul}, q49: {type: noul}, q50: {type: noul}, q51: {type: noul}, q52: {type: noul}, q53: {type: noul}, q54: {type: noul}, q55: {type: noul}, q56: {type: noul}, q57: {type: noul}, q58: {type: noul}, q59: {type: noul}, q60: {type: noul}, q61: {type: noul}, q62: {type: noul}, q63: {type: noul}, q64: {type: noul}}\n    rules:\n      - {name: default, route: small}\n",
        "c.yaml:6:5: policies.auto.questions: expected at most 64 item(s), found more",
        id="too many questions",
    ),
    pytest.param(
        "upstreams: {small: {url: http://a}}\npolicies: [a]\n",
        "c.yaml:2:1: policies: expected a mapping, found a list",
        id="policies list",
    ),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_invalid_file(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text.replace("{HEAD}", HEAD), "c.yaml")
    assert str(info.value) == expected


def test_valid_file_loads_frozen_objects() -> None:
    config = parse_config(VALID, "c.yaml")
    policy = config.policies["auto"]
    assert list(policy.questions) == ["kind", "jailbreak"]  # only what the rules read is asked
    assert policy.unused_questions == ("difficulty",)
    assert [str(w) for w in config.warnings] == [
        "c.yaml:9:7: policies.auto.questions.difficulty: question 'difficulty' is not used by any rule;"
        " it will not be asked"
    ]
    assert policy.questions["jailbreak"].to_wire() == {
        "type": "noul",
        "instructions": None,
        "criteria": {"true": "trying to bypass rules", "false": "ordinary"},
    }
    assert config.upstreams["small"].url == "http://127.0.0.1:8001/v1"
    assert config.engine.kind == "embedded"
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.name = "other"  # type: ignore[misc]
    with pytest.raises(Exception, match="frozen"):
        config.upstreams["small"].url = "http://elsewhere"  # type: ignore[misc]


def test_errors_are_listed_in_file_order() -> None:
    text = (
        HEAD
        + """    rules:
      - {name: a, route: nowhere}
      - {name: b, when: x > 1, route: small}
      - {name: default, route: small}
"""
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert [(issue.line, issue.key) for issue in info.value.issues] == [
        (7, "policies.auto.rules[0].route"),
        (8, "policies.auto.rules[1]"),
        (8, "policies.auto.rules[1].when"),
        (9, "policies.auto.rules[2]"),
    ]


def test_yes_and_no_are_strings_not_booleans() -> None:
    text = (
        HEAD
        + """    questions:
      answer: {type: choice, criteria: {yes: agree, no: disagree, on: maybe}}
    rules:
      - {name: agree, when: answer == "yes", route: large}
      - {name: default, route: small}
"""
    )
    policy = parse_config(text).policies["auto"]
    question = policy.questions["answer"]
    assert question.to_wire()["criteria"] == {"yes": "agree", "no": "disagree", "on": "maybe"}


def test_remote_engine_settings() -> None:
    text = """engine:
  remote: {urls: [http://d3-a:8000, http://d3-b:8000], timeout_s: 1.5, api_key_env: D3_KEY}
  cache: {max_entries: 0}
  max_choice_options: 26
upstreams: {small: {url: http://127.0.0.1:8001/v1/}}
"""
    config = parse_config(text)
    assert config.engine.kind == "remote"
    assert config.engine.remote is not None
    assert config.engine.remote.urls == ["http://d3-a:8000", "http://d3-b:8000"]
    assert config.engine.remote.timeout_s == 1.5
    assert config.engine.cache.max_entries == 0
    assert config.upstreams["small"].url == "http://127.0.0.1:8001/v1"
    assert config.policies == {}


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(VALID, encoding="utf-8")
    config = load_config(path)
    assert config.file == str(path)
    assert list(config.policies) == ["auto"]


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}: cannot read the file: No such file or directory$"
    ):
        load_config(path)


def test_load_config_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"upstreams: {caf\xe9: {url: http://a}}\n")
    with pytest.raises(ConfigError, match=r": the file is not UTF-8 \(byte 15\)$"):
        load_config(path)


def test_load_config_too_large(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"#" * (4 * 1024 * 1024 + 1))
    with pytest.raises(ConfigError, match=r": the file is over 4 MiB$"):
        load_config(path)


def test_a_broken_reload_leaves_nothing_half_applied(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(VALID, encoding="utf-8")
    first = load_config(path)
    path.write_text(VALID.replace("route: small}", "route: smal}"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown upstream 'smal'"):
        load_config(path)
    assert first.policies["auto"].rules[-1].name == "default"  # the config in hand is untouched
