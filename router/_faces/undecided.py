"""What the proxy sends on undecided (router/_faces/proxy.py): a model `server.undecided_models` lists, and the
`/v1/*` paths `server.passthrough` lists (a stored response or conversation only to the caller who made it, at the
upstream holding it: router/_faces/owned.py). Both go to one upstream as they came; a failure is a 502/503/504 in
the path's API shape.

    undecided = Undecided(forwarder, sessions, lambda: service.snapshot, routes)
    await undecided.model(request)                               # a listed model, its body read
    await undecided.passthrough(scope, receive, send, caller)    # any other /v1/* path
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.types import Receive, Scope, Send

from policies import UpstreamSettings
from router._apis.registry import API_BY_PATH, error_api
from router._asgi.headers import Headers, content_length
from router._asgi.messages import cancel_on_disconnect, read_body
from router._asgi.relay import UpstreamBroke, relay
from router._decision.service import Snapshot
from router._errors import BadRequest, ModelNotFound, NoRoute, RequestError, UpstreamFailed
from router._faces.auth import Caller
from router._faces.forward import Forwarder, allowed, decided_path, unsafe_path
from router._faces.owned import owned
from router._faces.request import Decided, available
from router._sessions.session import Sessions


class Undecided:
    """The proxy's undecided ways to an upstream; `routes` are the proxy's own (method, path) pairs, never passed
    through however spelled."""

    def __init__(self, forwarder: Forwarder, sessions: Sessions, snapshot: Callable[[], Snapshot],
                 routes: Iterable[tuple[str, str]]) -> None:  # fmt: skip
        self.forwarder = forwarder
        self.sessions = sessions
        self.snapshot = snapshot
        self.routes = tuple(routes)

    async def model(self, request: Decided) -> None:
        """A model `server.undecided_models` lists (and no policy names) goes untouched to the upstream serving it."""
        model, config = request.body.get("model"), request.config
        for name, upstream in config.upstreams.items():
            if isinstance(model, str) and model in (upstream.model, name):
                tag = [(b"x-d3-upstream", name.encode("latin-1", "replace"))] if request.debug else []
                await self.as_is(request, name, upstream, "POST", request.api.upstream_path, tag)
                return
        known = ", ".join(available(config, request.caller)) or "none"
        await request.fail(ModelNotFound(f"the model {model!r} does not exist or this key may not use it; "
                                         f"available: {known}"))  # fmt: skip

    async def passthrough(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """Other `/v1/*` requests: those `server.passthrough` lists go to the first upstream as they came (the path
        as the client wrote it, once checked); others get 404. Errors in the path's API shape (`error_api`)."""
        request = Decided(scope, receive, send, error_api(scope["path"]), self.snapshot(), caller)
        config = request.config
        raw_path = (scope.get("raw_path") or scope["path"].encode("utf-8")).split(b"?")[0]
        try:
            problem = unsafe_path(raw_path)
            if problem is not None:
                raise BadRequest(f"the path holds {problem}; it is not forwarded")
            # A stored response or conversation: the caller's own only, at its upstream (router/_faces/owned.py).
            target = await owned(self.sessions, config, scope["method"], raw_path, caller.id)
            endpoint = None if target else decided_path(raw_path, (*API_BY_PATH, *(p for _, p in self.routes)))
            if endpoint is not None:  # however spelled, a decided endpoint is never passed through (issue 25.2)
                raise NoRoute(f"no route for {scope['method']} {scope['path']}; {endpoint} is served as "
                              f"POST {endpoint} only")  # fmt: skip
            if not allowed(scope["path"], config.server.passthrough):
                raise NoRoute(f"no route for {scope['method']} {scope['path']}; d3-router forwards only the paths "
                              "server.passthrough lists")  # fmt: skip
            request.raw = await read_body(receive, config.server.max_body_bytes, content_length(scope["headers"]))
        except RequestError as exc:
            await request.fail(exc)
            return
        name, upstream, remember = target or (*next(iter(config.upstreams.items())), None)
        path = raw_path.decode("latin-1").removeprefix("/v1")
        await cancel_on_disconnect(receive, lambda: self.as_is(request, name, upstream, scope["method"], path, [],
                                                                remember))  # fmt: skip

    async def as_is(
        self, request: Decided, name: str, upstream: UpstreamSettings, method: str, path: str, extra: Headers,
        remember: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:  # fmt: skip
        """Forward an undecided request untouched to one upstream (`remember` reads its successful answer); its
        failure is a 502/503/504 in its API's shape."""
        response, failure = await self.forwarder.open(request.api, upstream, name, method, path, request.scope,
                                                      request.raw, [])  # fmt: skip
        if response is not None:
            try:
                await relay(response, request.send, extra, name, remember if response.is_success else None)
                return
            except UpstreamBroke as exc:
                failure = (502, str(exc))
        await request.fail(UpstreamFailed(failure[1], status=failure[0]), extra)
