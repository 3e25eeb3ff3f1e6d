"""Which policy decides a request (router/_decision/pick.py): the one its `model` names, else the default; a policy
that does not serve the request's API is a 404 naming it."""

from __future__ import annotations

import pytest

from policies import parse_config
from router import API_BY_NAME
from router._decision.pick import policy_for
from router._errors import ModelNotFound

CONFIG = """
server: {{default_policy: {default}}}
upstreams: {{small: {{url: http://small.test/v1}}}}
policies:
  auto: {{rules: [{{name: d, route: small}}]}}
  chat-only: {{apis: [chat], rules: [{{name: d, route: small}}]}}
"""


@pytest.mark.parametrize("model", [["auto"], {"auto": 1}, 7, None])
def test_a_model_that_is_not_a_string_names_no_policy(model: object) -> None:
    """A list or an object is never looked up (it cannot be a key): the default decides, or none."""
    with_default = parse_config(CONFIG.format(default="auto"), "c.yaml")
    assert policy_for(with_default, API_BY_NAME["chat"], model) is with_default.policies["auto"]
    without = parse_config(CONFIG.format(default="null"), "c.yaml")
    assert policy_for(without, API_BY_NAME["chat"], model) is None


def test_a_policy_that_does_not_serve_the_api_is_a_404_naming_it() -> None:
    config = parse_config(CONFIG.format(default="null"), "c.yaml")
    assert policy_for(config, API_BY_NAME["chat"], "chat-only") is config.policies["chat-only"]
    with pytest.raises(ModelNotFound) as refused:
        policy_for(config, API_BY_NAME["messages"], "chat-only")
    assert (
        str(refused.value)
        == "the policy 'chat-only' does not serve the Anthropic Messages (/v1/messages) API (its `apis`)"
    )
    assert refused.value.status == 404
