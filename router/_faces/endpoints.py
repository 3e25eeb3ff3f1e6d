"""The proxy's endpoints beside the decided ones: `GET /v1/models`, `POST /v1/d3/explain`, `/healthz`, `/readyz`,
`/metrics` and `POST /admin/reload` (router/_faces/proxy.py routes to them)."""

from __future__ import annotations

import dataclasses
import hmac
import json
import time
from typing import Any
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from d3backend import CachedEngine, json_bytes
from router._apis.body import read_request
from router._apis.chat import CHAT, Api
from router._apis.registry import detect, error_api
from router._asgi.headers import header
from router._asgi.messages import send_bytes, send_json
from router._decision.judge import answer_explainer
from router._errors import Forbidden, ModelNotFound, RequestError, Unauthorized, answer
from router._faces.auth import Caller
from router._faces.lifecycle import Lifecycle
from router._faces.request import available

ADMIN = Caller("admin", "admin", debug=True)  # explain with the admin token


class Endpoints(Lifecycle):
    """The other endpoints, as methods of the proxy app."""

    environ: dict[str, str]
    draining: bool
    _probing: bool

    async def models(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """The models this caller may send (its key's policies, and undecided), in the shape its API lists them."""
        api = error_api(scope["path"], scope["headers"])
        await send_json(send, 200, api.model_list(available(self.config, caller), int(time.time())))

    async def explain(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """A dry run for a body of any decided API (`?api=chat|completions|responses|messages`, else guessed from
        its fields): state, questions, answers and rule trace; no upstream is called. With `d3_answer` (an answer's
        text and tool calls) the policy's answer guard judges that answer too (router/_decision/judge.py `explain`).
        It tells what a guard answers, so it needs a key with `debug` or the admin token (issue 25.4); the session it
        shows is the caller's own."""
        try:
            if not caller.debug:
                raise Forbidden("explain needs a key with `debug` (server.auth) or the admin token in "
                                "x-d3-admin-token (server.admin_token_env)")  # fmt: skip
            _, given = await read_request(scope, receive, self.config.server.max_body_bytes)
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            body = {key: value for key, value in given.items() if key != "d3_answer"}
            api = detect(body, (query.get("api") or [None])[0])
            body, answer = answer_explainer(self.service, given, api.name)  # `d3_answer`: the answer guard's verdict
            if isinstance(body.get("model"), str) and not caller.may_use(body["model"]):
                raise ModelNotFound(f"the model {body['model']!r} does not exist or this key may not use it")
            turn = self.sessions.turn(api, scope["headers"], body, self.config, caller=caller.id, dry=True)
            payload = await self.service.explain(body, api, after=turn.route, caller=caller.id,
                                                 caller_facts=caller.facts, answer=answer)  # fmt: skip
        except RequestError as exc:
            await send_failure(send, exc)
            return
        await send_json(send, 200, json_bytes(payload))

    def _explainer(self, scope: Scope) -> Caller:
        """Explain with the admin token: as the caller the request's credential names (its sessions), allowed to
        see everything; with keys on and no known key, as the admin."""
        try:
            return dataclasses.replace(self.access.caller(scope["headers"]), debug=True, policies=None)
        except Unauthorized:
            return ADMIN

    def _admin(self, scope: Scope, name: bytes = b"authorization") -> bool:
        """Whether the request carries the admin token (server.admin_token_env) in header `name`."""
        return _token_matches(scope, self.environ.get(self.config.server.admin_token_env or "", ""), name)

    async def healthz(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        await send_json(send, 200, b'{"status":"ok"}')

    async def readyz(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """Ready while the engine answers, from the last probe: the engine is probed at most once per
        server.readyz_interval_s, whatever the rate of calls (a probe flood is no engine flood, issue 25.4); calls
        while a probe runs answer from the one before. Not ready while draining, whatever the engine says."""
        if self.draining:
            await send_json(send, 503, b'{"status":"not ready","reason":"draining: the router is shutting down"}')
            return
        now = self.clock()
        due = self._probed_at is None or now - self._probed_at >= self.config.server.readyz_interval_s
        if due and not self._probing:
            self._probing, self._probed_at = True, now
            try:
                await self.check_engine()
            finally:
                self._probing = False
        if self.ready:
            await send_json(send, 200, b'{"status":"ready"}')
        else:
            body = json.dumps({"status": "not ready", "reason": self.ready_error})
            await send_json(send, 503, body.encode())

    async def metrics(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        env = self.config.server.metrics_token_env
        if env is not None and not _token_matches(scope, self.environ.get(env, "")):
            await send_failure(send, Forbidden("/metrics needs its token (server.metrics_token_env) as a Bearer key"))
            return
        engine = self.service.engine
        if isinstance(engine, CachedEngine):
            self.service.metrics.cache_entries = engine.stats.size
        self.service.metrics.engine_pool(engine)
        await send_bytes(send, 200, self.service.metrics.render().encode(), [], b"text/plain; version=0.0.4")

    async def admin_reload(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        if not self._admin(scope):
            await send_failure(send, Forbidden("reload needs the admin token (server.admin_token_env)"))
            return
        done = await self.areload()
        result: dict[str, Any] = {"reloaded": done.ok, "message": done.message}
        if done.restart:
            result["restart_needed"] = list(done.restart)
        await send_json(send, 200 if done.ok else 422, json.dumps(result).encode())


async def send_failure(send: Send, exc: RequestError, api: Api = CHAT) -> None:
    """An error on a path of no client API, in the OpenAI shape (the house default), or in `api`'s."""
    status, body, headers = answer(exc, api)
    await send_json(send, status, body, headers)


def _token_matches(scope: Scope, token: str, name: bytes = b"authorization") -> bool:
    """Whether header `name` carries `token` (as `Bearer TOKEN` in Authorization); never with no token set. Compared
    in constant time: no timing hint of the token."""
    value = (header(scope["headers"], name) or b"").decode("latin-1").strip()
    given = value.removeprefix("Bearer ").strip() if name == b"authorization" else value
    return bool(token) and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8", "replace"))
