"""Token counting, routed (issue 26.3): `POST /v1/messages/count_tokens` (the `anthropic` SDK's
`messages.count_tokens`, which agents call to decide when to compact) and `POST /v1/responses/input_tokens`.

    routes = count_routes(app)       # {("POST", path): handler} for each adapter with a `count_path`

A count goes to the upstream the request would be routed to, without any engine call: the session's route when the
request belongs to one (read, never written), else the policy's default route (its last rule). The body goes with
the model rewritten to the upstream's (no `set`: a count takes no generation parameters) and the upstream's key in
the API's own header (`x-api-key` for Anthropic's); the answer comes back as the upstream gave it. An upstream
that cannot count (404, 405 or 501), or that speaks another API (`upstreams.NAME.api`, docs/translation.md), gets
the router's estimate instead, about one token per 4 characters of the
request's text, marked `x-d3-estimate: true`. Errors are in the API's own shape.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.types import Receive, Scope, Send

from d3backend import json_bytes
from policies import Decision, Policy, Route, Step
from router._apis.body import read_request
from router._apis.chat import Api
from router._apis.content import Content
from router._apis.registry import APIS
from router._apis.state import DecisionState
from router._asgi.messages import cancel_on_disconnect, send_json
from router._asgi.relay import UpstreamBroke, relay
from router._decision.record import D3Decision
from router._decision.service import RouterService
from router._errors import BadRequest, ModelNotFound, RequestError, UpstreamFailed
from router._faces.auth import Caller
from router._faces.forward import Failure, Forwarder
from router._faces.request import Decided, available
from router._sessions.session import Sessions

logger = logging.getLogger(__name__)

CANNOT_COUNT = frozenset({404, 405, 501})  # the upstream has no such endpoint: the router estimates
ESTIMATE = [(b"x-d3-estimate", b"true")]
CHARS_PER_TOKEN = 4

Handler = Callable[[Scope, Receive, Send, Caller], Awaitable[None]]


class ProxyApp(Protocol):
    """What counting needs of the proxy (router/_faces/proxy.py): its configuration, sessions and upstreams."""

    service: RouterService
    sessions: Sessions
    forwarder: Forwarder


def count_routes(app: ProxyApp) -> dict[tuple[str, str], Handler]:
    """The counting endpoints of the adapters that have one."""
    return {("POST", api.count_path): functools.partial(count, app, api) for api in APIS if api.count_path}


async def count(app: ProxyApp, api: Api, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
    """One count request: read, its upstreams found, forwarded (or estimated); any error in `api`'s shape."""
    request = Decided(scope, receive, send, api, app.service.snapshot, caller)
    config = request.config
    try:
        request.raw, request.body = await read_request(scope, receive, config.server.max_body_bytes)
        policy = request.pick()
        upstreams = await _upstreams(app, request, policy)
    except RequestError as exc:
        await request.fail(exc)
        return
    await cancel_on_disconnect(receive, lambda: _forward(app, request, upstreams))


async def _upstreams(app: ProxyApp, request: Decided, policy: Policy | None) -> tuple[str, ...]:
    """Where the request would be routed, asking no engine: the session's route, else the default route; a model
    that goes undecided (server.undecided_models), to the upstream serving it."""
    config, model = request.config, request.body.get("model")
    if policy is None:
        for name, upstream in config.upstreams.items():
            if model in (upstream.model, name):
                return (name,)
        known = ", ".join(available(config, request.caller)) or "none"
        raise ModelNotFound(f"the model {model!r} does not exist or this key may not use it; available: {known}")
    default = policy.rules[-1]  # the loader makes the last rule an unconditional route
    if not isinstance(default.action, Route):
        raise RuntimeError(f"policy {policy.name!r} has no default route")  # unreachable for a loaded policy
    decision = Decision(policy.name, default.name, default.action, {}, {}, (Step(default.name, None, True),))
    d3 = D3Decision(policy.name, decision, {}, DecisionState(""), 0.0, False)
    turn = app.sessions.turn(request.api, request.scope["headers"], request.body, config, caller=request.caller.id,
                             dry=True)  # fmt: skip
    routed = (await turn.route(d3)).decision.action
    return routed.upstreams if isinstance(routed, Route) else default.action.upstreams


async def _forward(app: ProxyApp, request: Decided, upstreams: tuple[str, ...]) -> None:
    """To each upstream in turn (the next on a connect error or a 5xx); an upstream that cannot count: the estimate."""
    api, config = request.api, request.config
    path = (api.count_path or "").removeprefix("/v1")
    failure: Failure = (502, "no upstream was tried")
    for index, name in enumerate(upstreams):
        upstream = config.upstreams[name]
        shown = [(b"x-d3-upstream", name.encode("latin-1", "replace"))] if request.debug else []
        if upstream.api is not None and upstream.api != api.name:  # another API (issue 30): no count of this one
            await send_json(request.send, 200, api.counted(estimate(api, request.body)), [*shown, *ESTIMATE])
            return
        payload = api.rewrite(request.raw, request.body, upstream.model, {})
        response, failure = await app.forwarder.open(api, upstream, name, "POST", path, request.scope, payload, [])
        if response is None:
            continue
        if response.status_code in CANNOT_COUNT:
            await response.aclose()
            await send_json(request.send, 200, api.counted(estimate(api, request.body)), [*shown, *ESTIMATE])
            return
        if response.status_code >= 500 and index < len(upstreams) - 1:
            await response.aclose()
            failure = (502, f"upstream {name!r} answered {response.status_code}")
            continue
        try:
            await relay(response, request.send, shown, name)
            return
        except UpstreamBroke as exc:
            failure = (502, str(exc))
    await request.fail(UpstreamFailed(failure[1], status=failure[0]))


def estimate(api: Api, body: dict[str, Any]) -> int:
    """About one token per `CHARS_PER_TOKEN` characters of the request's text: its turns (system, messages, tool
    calls and results) and its tool definitions; images and files are not counted. A body the adapter cannot read is
    counted whole, as JSON."""
    try:
        turns = api.turns(body, Content(lenient=True))
    except BadRequest:
        return math.ceil(len(json_bytes(body)) / CHARS_PER_TOKEN)
    chars = sum(len(turn.text) + sum(len(call) for call in turn.calls) for turn in turns)
    tools = body.get("tools")
    if tools:
        chars += len(json_bytes(tools))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))
