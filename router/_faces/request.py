"""`Decided`: one request to a decided endpoint, as it goes through the proxy or the middleware.

    request = Decided(scope, receive, send, api, service.snapshot, caller)   # when it arrives (router/_faces/auth.py)
    request.raw, request.body = await read_request(scope, receive, request.config.server.max_body_bytes)
    ...
    await request.fail(exc)                                          # any RequestError, in the API's own shape

What the request is (its scope, API, raw and parsed body, the configuration snapshot it is served under, its trace
span) and what becomes of it (the policy, the decision, the session turn, the request id) travel together, down the
call chain, as Starlette's `Request` does; the faces' functions take it instead of a handful of loose values.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from starlette.types import Receive, Scope, Send

from policies import Config, Policy
from router._apis.answers import replacement
from router._apis.chat import Api
from router._asgi.headers import Headers, header
from router._asgi.messages import send_bytes, send_json
from router._decision.pick import policy_for
from router._decision.record import D3Decision
from router._decision.service import Snapshot
from router._errors import Blocked, ModelNotFound, RequestError, answer
from router._faces.auth import Caller
from router._faces.forward import Failure
from router._faces.limits import Pending
from router._observe.tracing import NO_SPAN, NoSpan, Span
from router._observe.usage import Spent
from router._sessions.session import SessionTurn


class Speculation(Protocol):
    """A speculative upstream request (router/_faces/overlap.py), as the route reads it: its response, when the
    decision agreed with it and `name` is the route's first upstream."""

    def take(self, name: str) -> Awaitable[tuple[httpx.Response | None, Failure]] | None: ...


@dataclass(eq=False, slots=True)
class Decided:
    """One decided request; built when it arrives, filled in as it goes (each field once)."""

    scope: Scope
    receive: Receive
    send: Send
    api: Api
    snapshot: Snapshot  # read once: a reload meanwhile does not change the configuration this request is served under
    caller: Caller  # who sends it (issue 25): scopes its session and its log line, limits what it may use and see
    raw: bytes = b""
    body: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None
    d3: D3Decision | None = None
    turn: SessionTurn | None = None
    request_id: str = ""
    span: Span | NoSpan = NO_SPAN
    budget_used: float = 0.0  # the share used of the caller's most used budget: the `budget.used` fact
    spent: Spent | None = None  # the answer's tokens and cost, once it was relayed (router/_observe/usage.py)
    speculation: Speculation | None = None  # its upstream request started before the decision (policy `overlap:`)
    rate: Pending | None = None  # its rate check, under way while the body is read (router/_faces/limits.py)

    @property
    def config(self) -> Config:
        return self.snapshot.config

    @property
    def debug(self) -> bool:
        """Whether the caller sees every decision header (its key's `debug`, or server.expose_decisions)."""
        return self.caller.debug or self.config.server.expose_decisions

    def pick(self) -> Policy | None:
        """The policy that decides this request; None when it may go undecided (server.undecided_models lists its
        model, and the caller's key allows it); else `ModelNotFound` (404), naming only what this caller may use,
        so that a key learns nothing of the policies it may not use (issue 25.1-2)."""
        model = self.body.get("model")
        policy = policy_for(self.config, self.api, model)
        if policy is not None and self.caller.may_use(policy.name):
            return policy
        if policy is None and isinstance(model, str) and undecided(self.config, model, self.caller):
            return None
        known = ", ".join(available(self.config, self.caller)) or "none"
        raise ModelNotFound(f"the model {model!r} does not exist or this key may not use it; available: {known}")

    async def admitted(self) -> None:
        """RateLimited (429) when the caller is over its rate: the verdict of the check begun when the request
        arrived, read before the request is decided (once; later calls return at once)."""
        if self.rate is not None:
            await self.rate.verdict()

    def header(self, name: bytes) -> str | None:
        """The request's header `name` (lower case), decoded, or None."""
        value = header(self.scope["headers"], name)
        return None if value is None else value.decode("latin-1")

    async def fail(self, exc: RequestError, headers: Headers | None = None) -> None:
        """Answer `exc` in the request's API shape, with `headers` (the decision's) before the error's own; a block
        `as_answer` as the model would answer (router/_apis/answers.py `replacement`), streamed if the request is."""
        if isinstance(exc, Blocked) and exc.as_answer:
            model = self.body.get("model")
            streamed = self.body.get("stream") is True
            body, kind = replacement(
                self.api.name, exc.message, model if isinstance(model, str) else "", streamed=streamed
            )
            await send_bytes(self.send, 200, body, list(headers or ()), kind)
            return
        status, body, extra = answer(exc, self.api)
        await send_json(self.send, status, body, [*(headers or ()), *extra])


def undecided(config: Config, model: str, caller: Caller) -> bool:
    """Whether a request naming `model` (no policy's name) may go undecided: server.undecided_models lists it (or
    `*`) and no default policy decides it, and the caller's key allows it."""
    allowed = config.server.undecided_models
    listed = "*" in allowed or model in allowed
    return listed and config.server.default_policy is None and caller.may_send_undecided(model)


def available(config: Config, caller: Caller) -> list[str]:
    """The model names `caller` may send: the policies it may use, then the upstreams' models it may send
    undecided (what `GET /v1/models` lists)."""
    names = [name for name in config.policies if caller.may_use(name)]
    for name, upstream in config.upstreams.items():
        model = upstream.model or name
        if model not in names and undecided(config, model, caller):
            names.append(model)
    return names
