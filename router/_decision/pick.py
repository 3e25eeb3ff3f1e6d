"""Which policy decides a request: the one its model names, else `server.default_policy`."""

from __future__ import annotations

from typing import Any

from policies import API_TITLES, Config, Policy
from router._apis.chat import Api
from router._errors import ModelNotFound


def policy_for(config: Config, api: Api, model: Any) -> Policy | None:
    """The policy that decides a request of `api` naming `model`: the policy of that name, else
    `server.default_policy`; None when neither (not ours to decide). `BadRequest` (404) when that policy does not
    serve `api` (its `apis`). The proxy, the middleware and explain pick alike."""
    policy = config.policies.get(model) if isinstance(model, str) else None
    if policy is None and config.server.default_policy is not None:
        policy = config.policies[config.server.default_policy]
    if policy is not None and api.name not in policy.apis:
        message = f"the policy {policy.name!r} does not serve the {API_TITLES[api.name]} API (its `apis`)"
        raise ModelNotFound(message)
    return policy
