"""Request rate limits per key and per group (issue 25.5): GCRA in process, shared through a real redis-server in one
round trip, 429 with Retry-After in the API's own shape; Redis down: per-replica limits, one log line, no failure.
Time is an injected clock: nothing here waits on the wall clock."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import ProxyApp, create_app
from tests.router._redis import RedisServer

pytestmark = pytest.mark.anyio

A, B, C = "sk-a-0123456789abcdef", "sk-b-0123456789abcdef", "sk-c-0123456789abcdef"
ENVIRON = {"KEY_A": A, "KEY_B": B, "KEY_C": C, "SALT": "test-salt"}
CONFIG = """
server:
  auth:
    keys:
      - {{name: a, key_env: KEY_A, rate: {{requests: 2, window_s: 10}}}}
      - {{name: b, key_env: KEY_B, group: team}}
      - {{name: c, key_env: KEY_C, group: team, rate: {{requests: 100, window_s: 10, burst: 100}}}}
    groups: {{team: {{rate: {{requests: 3, window_s: 30}}}}}}
{redis}upstreams: {{small: {{url: http://small.test/v1}}}}
policies: {{auto: {{rules: [{{name: d, route: small}}]}}}}
"""


def chat() -> dict[str, Any]:
    return {"model": "auto", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def apps(text: str, clock: Clock, count: int = 1) -> AsyncIterator[list[tuple[ProxyApp, httpx.AsyncClient]]]:
    with respx.mock(assert_all_called=False) as mock:
        mock.route().mock(return_value=httpx.Response(200, json={"ok": True}))
        made = [create_app(parse_config(text, "c.yaml"), engine=FakeEngine(), transport=httpx.AsyncHTTPTransport(),
                           environ=ENVIRON, wall_clock=clock) for _ in range(count)]  # fmt: skip
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") for app in made]
        try:
            yield list(zip(made, clients, strict=True))
        finally:
            for app, client in zip(made, clients, strict=True):
                await client.aclose()
                await app.aclose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def one(clock: Clock) -> AsyncIterator[httpx.AsyncClient]:
    async for pair in apps(CONFIG.format(redis=""), clock):
        yield pair[0][1]


async def test_a_keys_rate_then_429_with_retry_after_in_the_apis_shape(one: httpx.AsyncClient, clock: Clock) -> None:
    auth = {"authorization": f"Bearer {A}"}
    assert [(await one.post("/v1/chat/completions", json=chat(), headers=auth)).status_code for _ in range(2)] == [
        200, 200]  # fmt: skip
    over = await one.post("/v1/chat/completions", json=chat(), headers=auth)
    assert over.status_code == 429 and over.headers["retry-after"] == "5"
    assert over.json()["error"]["code"] == "rate_limit_exceeded" and over.json()["error"]["type"] == "rate_limit_error"
    anthropic = await one.post("/v1/messages", json=chat(), headers={"x-api-key": A})
    assert anthropic.status_code == 429
    assert anthropic.json()["error"]["type"] == "rate_limit_error" and anthropic.json()["type"] == "error"
    clock.now += 5.0  # one interval (window_s / requests) later: one more
    assert (await one.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 200
    assert (await one.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 429


async def test_a_groups_rate_is_shared_by_its_keys(one: httpx.AsyncClient, clock: Clock) -> None:
    statuses = []
    for key in (B, C, B, C):
        response = await one.post("/v1/chat/completions", json=chat(), headers={"authorization": f"Bearer {key}"})
        statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429]
    assert response.headers["retry-after"] == "10"
    clock.now += 10.0
    assert (await one.post("/v1/chat/completions", json=chat(), headers={"x-api-key": B})).status_code == 200


async def test_a_refused_request_does_not_count(one: httpx.AsyncClient, clock: Clock) -> None:
    auth = {"authorization": f"Bearer {A}"}
    for _ in range(2):
        await one.post("/v1/chat/completions", json=chat(), headers=auth)
    for _ in range(10):  # refused ones push nothing on
        assert (await one.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 429
    clock.now += 5.0
    assert (await one.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 200


async def test_two_replicas_share_the_limit_through_redis(redis_server: RedisServer, clock: Clock) -> None:
    text = CONFIG.format(redis=f"  redis: {redis_server.url}\n  sessions: {{salt_env: SALT}}\n")
    async for (_, first), (_, second) in apps(text, clock, count=2):
        auth = {"authorization": f"Bearer {A}"}
        assert (await first.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 200
        assert (await second.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 200
        assert (await first.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 429
        assert (await second.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 429
        clock.now += 5.0
        assert (await second.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 200
        assert (await first.post("/v1/chat/completions", json=chat(), headers=auth)).status_code == 429
    with redis_server.client() as client:
        assert sorted(client.keys("d3:rate:*")) == ["d3:rate:{key:a}"]


async def test_a_redis_cluster_node_keeps_a_key_and_its_group_in_one_slot(
    redis_cluster: RedisServer, clock: Clock
) -> None:
    """A Redis Cluster refuses a script whose keys hash to two slots (CROSSSLOT): a key's limit and its group's are
    checked in one script, so they carry one hash tag (the group's); a key in no group carries its own."""
    text = CONFIG.format(redis=f"  redis: {redis_cluster.url}\n  sessions: {{salt_env: SALT}}\n")
    async for (_, first), (_, second) in apps(text, clock, count=2):
        statuses = []
        for http, key in ((first, B), (second, C), (first, C), (second, B)):  # the group's 3 in 30 s, across both
            response = await http.post("/v1/chat/completions", json=chat(), headers={"authorization": f"Bearer {key}"})
            statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 429]
        for http in (first, second):
            assert (await http.post("/v1/chat/completions", json=chat(), headers={"x-api-key": A})).status_code == 200
        assert (await first.post("/v1/chat/completions", json=chat(), headers={"x-api-key": A})).status_code == 429
        assert "d3router_redis_errors_total{" not in (await first.get("/metrics")).text  # none failed (CROSSSLOT)
    with redis_cluster.client() as client:
        keys = sorted(client.keys("d3:rate:*"))
        assert keys == ["d3:rate:{group:team}", "d3:rate:{group:team}:key:c", "d3:rate:{key:a}"]
        assert len({client.cluster("KEYSLOT", key) for key in keys[:2]}) == 1


async def test_redis_down_limits_per_replica_with_one_log_line(
    redis_server: RedisServer, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    text = CONFIG.format(redis=f"  redis: {redis_server.url}\n  sessions: {{salt_env: SALT}}\n")
    caplog.set_level(logging.WARNING)
    async for [(_, http)] in apps(text, clock):
        redis_server.stop()
        auth = {"authorization": f"Bearer {A}"}
        statuses = [(await http.post("/v1/chat/completions", json=chat(), headers=auth)).status_code for _ in range(4)]
        assert statuses == [200, 200, 429, 429]  # this replica's own limit, no failed request
    down = [r for r in caplog.records if "redis" in r.getMessage() and "failed" in r.getMessage()]
    assert len(down) == 1


@pytest.mark.parametrize("body", [b"{not json", b'{"model": "no-such-policy", "messages": []}'])
async def test_a_limited_callers_429_wins_over_what_its_body_would_get(
    redis_server: RedisServer, clock: Clock, body: bytes
) -> None:
    """A caller over its rate gets the 429, not its bad body's 400 or its unknown model's 404: in process the rate is
    checked before the body is read; in Redis its answer is read before the body's fault is answered
    (tests/router/test_limits_overlap.py slows the answer down)."""
    auth = {"authorization": f"Bearer {A}", "content-type": "application/json"}
    for redis in ("", f"  redis: {redis_server.url}\n  sessions: {{salt_env: SALT}}\n"):
        async for [(_, http)] in apps(CONFIG.format(redis=redis), clock):
            first = [(await http.post("/v1/chat/completions", content=body, headers=auth)).status_code for _ in "ab"]
            assert first[0] == first[1] and first[0] in (400, 404)  # within the rate: what the body gets
            over = await http.post("/v1/chat/completions", content=body, headers=auth)
            assert (over.status_code, over.json()["error"]["code"]) == (429, "rate_limit_exceeded"), redis
        clock.now += 100.0
