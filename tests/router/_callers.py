"""Two callers and two upstreams, shared by the tests of what callers may share (issue 25.3): the callers' keys, the
configuration's upstreams and policy (`small`, and `large` for a HARD turn), fake upstreams answering with an id and
their name, and the proxy served in process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import create_app

A, B = "sk-caller-a-0123456789", "sk-caller-b-0123456789"
KEYS = "  auth: {keys: [{name: a, key_env: KEY_A}, {name: b, key_env: KEY_B}]}\n"  # under `server:`
ROUTES = """upstreams:
  small: {url: http://small.test/v1}
  large: {url: http://large.test/v1}
policies:
  auto:
    questions: {hard: {type: noul}}
    rules:
      - {name: hard, when: hard > 0.5, route: large}
      - {name: default, route: small}
"""


def config_text(server: str, keys: bool) -> str:
    """The `server:` block `server` (its settings indented two spaces), the two keys when `keys`, then the routes."""
    return server + (KEYS if keys else "") + ROUTES


def responder(name: str, seen: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    """Upstream `name`: records each request in `seen` and answers with a new id (`conv_...` for a conversation
    made, `resp_...` otherwise) and its name as `up`."""
    count = [0]

    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        count[0] += 1
        kind = "conv" if request.url.path == "/v1/conversations" else "resp"
        return httpx.Response(200, json={"id": f"{kind}_{name}_{count[0]}", "up": name})

    return respond


@asynccontextmanager
async def serving(text: str, answers: Callable[[Any, Any], dict[str, Any]], environ: dict[str, str],
                  seen: list[httpx.Request] | None = None, path: str = "c.yaml") -> AsyncIterator[httpx.AsyncClient]:  # fmt: skip
    """The proxy of configuration `text` in process, deciding with `answers`, its upstreams `small` and `large`
    faked (what they get appended to `seen`); yields a client of it, closes it after."""
    with respx.mock(assert_all_called=False) as mock:
        for name in ("small", "large"):
            mock.route(host=f"{name}.test").mock(side_effect=responder(name, [] if seen is None else seen))
        app = create_app(parse_config(text, path), engine=FakeEngine(answers), transport=httpx.AsyncHTTPTransport(),
                         environ=environ)  # fmt: skip
        await app.startup()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            yield client
        await app.aclose()
