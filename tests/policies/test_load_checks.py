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
