"""The shared second-level decision cache in a real Redis (issue 12.4): a decision one replica paid the engine for
is a cache hit on the others; Redis holds digests and answers, never the request's text; Redis gone, requests are
decided by the engine and none fails. Each test starts its own `redis-server` (tests/router/test_sessions_redis.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx
from prometheus_client.parser import text_string_to_metric_families

from d3backend import CachedEngine, FakeEngine
from policies import parse_config
from router import ProxyApp, create_app
from router._observe.metrics import Metrics
from router._sessions.store import RedisStore, SharedAnswers
from tests.router._redis import RedisServer

pytestmark = pytest.mark.anyio

# The salt: server.redis is refused without one (issue 25.6). expose_decisions: the tests read x-d3-cache, a debug
# header (closed by default, issue 25.4).
CONFIG = """
server: {{redis: "{redis}", redis_timeout_s: 0.2, sessions: {{salt_env: D3_SALT}}, expose_decisions: true}}
engine: {{remote: {{urls: ["http://d3.test:8000"]}}}}
upstreams: {{small: {{url: http://small.test/v1}}}}
policies:
  auto:
    questions: {{j: {{type: noul}}}}
    rules:
      - {{name: guard, when: j > 0.9, block: {{status: 403, message: no}}}}
      - {{name: default, route: small}}
"""
SECRET = "a prompt only the client may know"
ENVIRON = {"D3_SALT": "a-salt-every-replica-reads"}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        router.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={"ok": 1}))
        yield router


def replica(url: str) -> tuple[ProxyApp, FakeEngine]:
    """A router built from the configuration (its cache and Redis as `d3router serve` builds them), its engine
    replaced by a counting fake: the remote URL is never called."""
    app = create_app(parse_config(CONFIG.format(redis=url), "c.yaml"), transport=httpx.AsyncHTTPTransport(),
                     environ=ENVIRON)  # fmt: skip
    cached = app.service.engine
    assert isinstance(cached, CachedEngine) and isinstance(cached.shared, SharedAnswers)
    fake = FakeEngine({"j": 0.1})
    cached.engine = fake
    return app, fake


@pytest.fixture
async def replicas(redis_server: RedisServer, mock: respx.MockRouter) -> AsyncIterator[list[Any]]:
    pairs = [replica(redis_server.url), replica(redis_server.url)]
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") for app, _ in pairs]
    yield [(client, app, fake) for client, (app, fake) in zip(clients, pairs, strict=True)]
    for client, (app, _) in zip(clients, pairs, strict=True):
        await client.aclose()
        await app.aclose()


def body(text: str) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}]}


def counted(app: ProxyApp, name: str) -> dict[str, float]:
    return {sample.labels.get("result", ""): sample.value
            for family in text_string_to_metric_families(app.service.metrics.render())
            if family.name == name for sample in family.samples if sample.name.endswith("_total")}  # fmt: skip


async def written(redis_server: RedisServer, count: int) -> list[str]:
    """The answer keys in Redis, once `count` are there (the write runs after the answer, in the background)."""
    deadline = time.monotonic() + 10
    with redis_server.client() as client:
        while True:
            keys = sorted(client.scan_iter("d3:answers:*"))
            if len(keys) >= count or time.monotonic() > deadline:
                return keys
            await asyncio.sleep(0.01)


async def test_a_decision_paid_on_one_replica_is_a_hit_on_the_other(
    replicas: list[Any], redis_server: RedisServer
) -> None:
    (first, first_app, first_engine), (second, second_app, second_engine) = replicas
    answer = await first.post("/v1/chat/completions", json=body(SECRET))
    assert (answer.status_code, answer.headers["x-d3-cache"]) == (200, "miss")
    [key] = await written(redis_server, 1)
    shared = await second.post("/v1/chat/completions", json=body(SECRET))
    assert (shared.status_code, shared.headers["x-d3-cache"]) == (200, "hit")
    assert (len(first_engine.calls), len(second_engine.calls)) == (1, 0)
    assert counted(second_app, "d3router_shared_cache") == {"hit": 1.0}
    assert counted(first_app, "d3router_shared_cache") == {"miss": 1.0}
    with redis_server.client() as client:  # digests and probabilities; never the request's text
        assert len(key) == len("d3:answers:") + 32
        value = client.get(key)
        assert client.pttl(key) > 0
    assert value is not None and SECRET not in value and "prompt" not in value


async def test_redis_gone_the_engine_decides_and_no_request_fails(
    replicas: list[Any], redis_server: RedisServer
) -> None:
    first, (second, second_app, second_engine) = replicas[0][0], replicas[1]
    await first.post("/v1/chat/completions", json=body("before"))
    await written(redis_server, 1)
    redis_server.stop()
    statuses = [(await second.post("/v1/chat/completions", json=body(f"turn {i}"))).status_code for i in range(5)]
    statuses.append((await second.post("/v1/chat/completions", json=body("before"))).status_code)
    assert statuses == [200] * 6
    assert len(second_engine.calls) == 6  # Redis could not answer "before": the engine did
    assert sum(counted(second_app, "d3router_redis_fallbacks").values()) > 0
    assert counted(second_app, "d3router_shared_cache") == {"down": 6.0}


async def test_without_redis_there_is_no_shared_level() -> None:
    server = CONFIG.splitlines()[1]
    assert server.startswith("server: {{redis:")
    config = CONFIG.replace(server + "\n", "")
    app = create_app(parse_config(config.replace("{{", "{").replace("}}", "}"), "c.yaml"))
    try:
        assert isinstance(app.service.engine, CachedEngine) and app.service.engine.shared is None
    finally:
        await app.aclose()


async def test_the_cache_turned_off_turns_off_its_shared_level_too(redis_server: RedisServer) -> None:
    config = CONFIG.format(redis=redis_server.url).replace(
        'urls: ["http://d3.test:8000"]}', 'urls: ["http://d3.test:8000"]}, cache: {max_entries: 0}'
    )
    app = create_app(parse_config(config, "c.yaml"), environ=ENVIRON)
    try:
        assert isinstance(app.service.engine, CachedEngine) and app.service.engine.shared is None
    finally:
        await app.aclose()


async def test_keys_are_salted_so_a_guessed_prompt_cannot_be_tested_against_them(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, timeout_s=1.0, metrics=Metrics())
    ours, theirs = SharedAnswers(store, Metrics(), b"our salt"), SharedAnswers(store, Metrics(), b"their salt")
    digest = "ab" * 16  # what CachedEngine passes: the decision's content digest
    try:
        await ours.set(digest, "answers", 60)
        assert (await ours.get(digest), await theirs.get(digest)) == ("answers", None)
        with redis_server.client() as client:
            [key] = client.keys("d3:answers:*")
        assert key != "d3:answers:" + digest and len(key) == len("d3:answers:") + 32
    finally:
        await store.aclose()
