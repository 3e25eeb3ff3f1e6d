"""The loader's checks of client keys, what goes undecided and overlap, word for word and where: the errors refuse
the file, the warnings load it (pinned where mutmut found a change no test of its selection noticed; issue 23)."""

from __future__ import annotations

import pytest

from policies import ConfigError, parse_config

UPSTREAMS = "upstreams:\n  small: {url: http://127.0.0.1:8001/v1}\n  large: {url: http://127.0.0.1:8002/v1}\n"
POLICY = "policies:\n  auto:\n    questions: {j: {type: noul}}\n    rules:\n      - {name: default, when: j > 0.5, route: large}\n      - {name: rest, route: small}\n"
ASKS_NOTHING = "policies:\n  auto:\n    rules:\n      - {name: rest, route: small}\n"


def keys(*entries: str) -> str:
    return "server:\n  auth:\n    keys:\n" + "".join(f"      - {entry}\n" for entry in entries)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            keys("{name: a, key_env: KA}", "{name: a, key_env: KB}") + UPSTREAMS + POLICY,
            "c.yaml:5:10: server.auth.keys[1].name: key name 'a' is used twice",
            id="key twice",
        ),
        pytest.param(
            keys("{name: a, key_env: KA, policies: [auto, other]}") + UPSTREAMS + POLICY,
            "c.yaml:4:32: server.auth.keys[0].policies: unknown policy 'other'; expected one of 'auto'",
            id="key policy unknown",
        ),
        pytest.param(
            UPSTREAMS
            + POLICY.replace("    rules:", "    session: {mode: 'off'}\n    overlap: {when: sticky}\n    rules:"),
            "c.yaml:8:15: policies.auto.overlap.when: `when: sticky` speculates on the session's route, but the "
            "policy's session mode is off; use `when: always` or a session mode",
            id="overlap sticky without a session",
        ),
        pytest.param(
            UPSTREAMS + POLICY.replace("    rules:", "    overlap: {when: always, route: huge}\n    rules:"),
            "c.yaml:7:29: policies.auto.overlap.route: unknown upstream 'huge'; expected one of 'small', 'large'",
            id="overlap route unknown",
        ),
    ],
)
def test_a_refused_check_names_its_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    assert str(caught.value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "server:\n  undecided_models: [big-model, other]\n" + UPSTREAMS + POLICY,
            [
                "c.yaml:2:3: server.undecided_models: 'big-model', 'other' reach an upstream without a decision "
                "(undecided); no guard sees them"
            ],
            id="undecided",
        ),
        pytest.param(
            "server:\n  default_policy: auto\n  undecided_models: [big-model]\n" + UPSTREAMS + POLICY,
            [
                "c.yaml:3:3: server.undecided_models: 'big-model' reach an upstream without a decision (ignored: "
                "server.default_policy decides them); no guard sees them"
            ],
            id="undecided ignored",
        ),
        pytest.param(
            "server:\n  passthrough: [/v1/files, /v1/batches]\n" + UPSTREAMS + POLICY,
            [
                "c.yaml:2:3: server.passthrough: /v1/files, /v1/batches go undecided to the upstream 'small', with "
                "its key"
            ],
            id="passthrough",
        ),
        pytest.param(
            UPSTREAMS + ASKS_NOTHING.replace("    rules:", "    overlap: {when: always}\n    rules:"),
            [
                "c.yaml:6:5: policies.auto.overlap: the policy asks the engine nothing, so there is no decision to "
                "overlap; remove overlap"
            ],
            id="overlap without questions",
        ),
        pytest.param(
            UPSTREAMS
            + POLICY.replace("    rules:", "    session: {mode: 'off'}\n    overlap: {when: always}\n    rules:"),
            [],
            id="overlap always without a session",
        ),
    ],
)
def test_a_warning_loads_the_file_and_says_what_goes_undecided(text: str, expected: list[str]) -> None:
    assert [str(warning) for warning in parse_config(text, "c.yaml").warnings] == expected


TRANSLATED = (
    "upstreams:\n  small: {url: http://127.0.0.1:8001/v1}\n  large: {url: http://127.0.0.1:8002/v1, api: chat}\n"
    "  msg: {url: http://127.0.0.1:8003/v1, api: messages}\npolicies:\n  auto:\n"
)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(
            "    rules:\n      - {name: rest, route: large}\n",
            "c.yaml:8:22: policies.auto.rules[0].route: upstream 'large' speaks the Chat Completions "
            "(/v1/chat/completions) API, and no translation carries the Completions (/v1/completions) API to it; "
            "limit the policy's `apis`, e.g. `apis: [chat, responses, messages]` (docs/translation.md)",
            id="route",
        ),
        pytest.param(
            "    apis: [completions]\n    rules:\n      - {name: rest, route: [small, large]}\n",
            "c.yaml:9:22: policies.auto.rules[0].route: upstream 'large' speaks the Chat Completions "
            "(/v1/chat/completions) API, and no translation carries the Completions (/v1/completions) API to it; "
            "limit the policy's `apis` (docs/translation.md)",
            id="route list, its second upstream",
        ),
        pytest.param(
            "    apis: [chat]\n    rules:\n      - {name: rest, route: msg, set: {frequency_penalty: 0.1}}\n",
            "c.yaml:9:40: policies.auto.rules[0].set.frequency_penalty: `set` 'frequency_penalty' has no equivalent in "
            "the Anthropic Messages (/v1/messages) API that upstream 'msg' speaks: a translated request would lose it; "
            "remove it or route elsewhere",
            id="set lost in translation",
        ),
        pytest.param(
            "    apis: [chat, messages]\n    rules:\n      - {name: rest, route: small, set: {frequency_penalty: 0.1}}\n",
            "c.yaml:9:42: policies.auto.rules[0].set.frequency_penalty: `set` 'frequency_penalty' has no equivalent in "
            "the Anthropic Messages (/v1/messages) API; limit the policy's `apis` to those that take it, e.g. "
            "`apis: [chat]`",
            id="set one api lacks",
        ),
        pytest.param(
            "    apis: [messages]\n    rules:\n      - {name: rest, route: small, set: {frequency_penalty: 0.1}}\n",
            "c.yaml:9:42: policies.auto.rules[0].set.frequency_penalty: `set` 'frequency_penalty' has no equivalent in "
            "the Anthropic Messages (/v1/messages) API; limit the policy's `apis` to those that take it, or remove it",
            id="set no api takes",
        ),
    ],
)
def test_a_route_or_set_no_translation_carries_is_refused_saying_how_to_fix_it(policy: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(TRANSLATED + policy, "c.yaml")
    assert str(caught.value) == expected


def test_routes_and_sets_every_api_of_the_policy_can_carry_load() -> None:
    text = (
        TRANSLATED
        + "    apis: [chat, responses]\n    rules:\n      - {name: rest, route: [large, msg], set: {temperature: 0.1}}\n"
    )
    assert parse_config(text, "c.yaml").policies["auto"].rules[-1].params == {"temperature": 0.1}


SHADOWS = UPSTREAMS + "policies:\n"
REST = "    rules:\n      - {name: rest, route: small}\n"


@pytest.mark.parametrize(
    ("policies", "expected"),
    [
        pytest.param("  auto:\n    shadow: auto\n" + REST + "  b:\n" + REST + "  c:\n" + REST, "'b', 'c'", id="itself"),
        pytest.param("  auto:\n    shadow: nope\n" + REST + "  b:\n" + REST, "'b'", id="unknown"),
        pytest.param("  auto:\n    shadow: nope\n" + REST, "none", id="no other policy"),
    ],
)
def test_a_shadow_must_be_another_policy(policies: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(SHADOWS + policies, "c.yaml")
    assert (
        str(caught.value)
        == f"c.yaml:6:5: policies.auto.shadow: the shadow must be another policy; expected one of {expected}"
    )


@pytest.mark.parametrize(("tiers", "warned"), [("", True), ("\n  huge: {url: http://127.0.0.1:8003/v1}", True),
                                               ("\n  huge: {url: http://127.0.0.1:8003/v1, tier: 2}", False)])  # fmt: skip
def test_escalate_over_upstreams_of_one_tier_is_warned_about(tiers: str, warned: bool) -> None:
    text = SHADOWS.replace("\npolicies:", tiers + "\npolicies:") + "  auto:\n    session: {mode: escalate}\n" + REST
    config = parse_config(text, "c.yaml")
    expected = (
        "policies.auto.session.mode: escalate moves a session to a stronger upstream, but every upstream has the "
    )
    expected += "same tier; set upstreams.NAME.tier (higher is stronger)"
    assert [str(warning).split(": ", 1)[1] for warning in config.warnings] == ([expected] if warned else [])
    assert not warned or str(config.warnings[0]).startswith("c.yaml:")


def test_a_policy_keeps_its_apis_shadow_and_session() -> None:
    text = SHADOWS + "  auto:\n    apis: [chat]\n    shadow: b\n    session: {mode: 'off', ttl_s: 60}\n" + REST
    config = parse_config(text + "  b:\n" + REST, "c.yaml")
    policy = config.policies["auto"]
    assert (policy.apis, policy.shadow, policy.session.mode, policy.session.ttl_s) == (
        frozenset({"chat"}),
        "b",
        "off",
        60,
    )
    assert config.server.default_policy is None and config.server.max_body_bytes > 0  # the server's settings kept


def pool(first: float, second: float, last: float) -> str:
    members = "".join(
        f"    - {{name: {name}, remote: {{urls: [http://127.0.0.1:900{n}], timeout_s: {timeout}}}}}\n"
        for n, (name, timeout) in enumerate((("a", first), ("b", second), ("c", last)), 1)
    )
    return "server: {decision_timeout_s: 1.0}\nengine:\n  pool:\n" + members + SHADOWS + "  auto:\n" + REST


@pytest.mark.parametrize(
    ("timeouts", "expected"),
    [
        pytest.param(
            (0.5, 0.6, 0.5),
            "c.yaml:5:57: engine.pool[1].remote.timeout_s: the pool's engines up to 'b' may take 1.1 s",
            id="the first two together",
        ),
        pytest.param(
            (1.0, 0.5, 0.5),
            "c.yaml:4:57: engine.pool[0].remote.timeout_s: the pool's engines up to 'a' may take 1 s",
            id="the first alone, exactly the budget",
        ),
        pytest.param((0.25, 0.25, 5.0), None, id="the last engine's time is its own"),
    ],
)
def test_a_pool_leaves_each_next_engine_time_to_answer(
    timeouts: tuple[float, float, float], expected: str | None
) -> None:
    if expected is None:
        assert [member.label for member in parse_config(pool(*timeouts), "c.yaml").engine.pool or ()] == ["a", "b", "c"]
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(pool(*timeouts), "c.yaml")
    assert str(caught.value).startswith(expected + " (a remote engine's try and its retry), which uses up")


@pytest.mark.parametrize(
    ("policies", "known"),
    [
        pytest.param(POLICY + "  b:\n" + REST, "'auto', 'b'", id="two"),
        pytest.param("policies: {}\n", "none", id="none"),
    ],
)
def test_a_keys_unknown_policy_is_refused_naming_the_policies_there_are(policies: str, known: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(keys("{name: a, key_env: KA, policies: [other]}") + UPSTREAMS + policies, "c.yaml")
    assert (
        str(caught.value)
        == f"c.yaml:4:32: server.auth.keys[0].policies: unknown policy 'other'; expected one of {known}"
    )


def test_a_block_keeps_its_as_answer() -> None:
    text = UPSTREAMS + POLICY.replace("route: large}", "block: {status: 403, message: no, as_answer: true}}")
    action = parse_config(text, "c.yaml").policies["auto"].rules[0].action
    assert action is not None and action.kind == "block" and action.as_answer is True


def test_a_choice_too_big_for_a_pool_engine_is_one_issue_and_the_question_still_known() -> None:
    members = "".join(
        f"    - {{name: {name}, remote: {{urls: [http://127.0.0.1:900{n}], timeout_s: 0.1}}, max_choice_options: 2}}\n"
        for n, name in enumerate("ab", 1)
    )
    text = (
        "engine:\n  pool:\n"
        + members
        + UPSTREAMS
        + (
            "policies:\n  auto:\n    questions: {k: {type: choice, criteria: {a: x, b: y, c: z}}}\n    rules:\n"
            '      - {name: code, when: k == "a", route: small}\n      - {name: rest, route: small}\n'
        )
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    assert str(caught.value) == (
        "c.yaml:10:35: policies.auto.questions.k.criteria: this choice has 3 options; the pool's engine 'a' takes at "
        "most 2 (engine.pool[0].max_choice_options)"
    )
