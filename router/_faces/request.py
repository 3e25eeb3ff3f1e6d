"""`Decided`: one request to a decided endpoint, as it goes through the proxy or the middleware.

    request = Decided(scope, receive, send, api, service.snapshot)   # when it arrives
    request.raw, request.body = await read_request(scope, receive, request.config.server.max_body_bytes)
    ...
    await request.fail(exc)                                          # any RequestError, in the API's own shape

What the request is (its scope, API, raw and parsed body, the configuration snapshot it is served under, its trace
span) and what becomes of it (the policy, the decision, the session turn, the request id) travel together, down the
call chain, as Starlette's `Request` does; the faces' functions take it instead of a handful of loose values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

from policies import Config, Policy
from router._apis.chat import Api
from router._asgi.headers import Headers, header
from router._asgi.messages import send_json
from router._decision.record import D3Decision
from router._decision.service import Snapshot
from router._errors import RequestError, answer
from router._observe.tracing import NO_SPAN, NoSpan, Span
from router._sessions.session import SessionTurn


@dataclass(eq=False, slots=True)
class Decided:
    """One decided request; built when it arrives, filled in as it goes (each field once)."""

    scope: Scope
    receive: Receive
    send: Send
    api: Api
    snapshot: Snapshot  # read once: a reload meanwhile does not change the configuration this request is served under
    raw: bytes = b""
    body: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None
    d3: D3Decision | None = None
    turn: SessionTurn | None = None
    request_id: str = ""
    span: Span | NoSpan = NO_SPAN

    @property
    def config(self) -> Config:
        return self.snapshot.config

    def header(self, name: bytes) -> str | None:
        """The request's header `name` (lower case), decoded, or None."""
        value = header(self.scope["headers"], name)
        return None if value is None else value.decode("latin-1")

    async def fail(self, exc: RequestError, headers: Headers | None = None) -> None:
        """Answer `exc` in the request's API shape, with `headers` (the decision's) before the error's own."""
        status, body, extra = answer(exc, self.api)
        await send_json(self.send, status, body, [*(headers or ()), *extra])
