"""Token budgets and token rates (issue 29.4): two `d3router serve` replicas sharing a real redis-server use up one
budget together, the rule reading `budget.used` moves traffic first, then both answer 429 naming the budget; in
process, token rates, cost budgets, the periods and Redis down."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from d3backend import free_port
from policies import BudgetSpec, TokenRateSpec, parse_config
from router import create_app
from router._errors import RateLimited
from router._faces.auth import Caller
from router._faces.budgets import Budgets, limits
from tests.router._peers import http_upstream, send_json, wait_until_ready
from tests.router._redis import RedisServer

KEY = "sk-alice-0123456789abcdef"
USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}  # 20 tokens an answer


class _Counting(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        send_json(self, json.dumps({"id": "c", "object": "chat.completion", "model": "m", "usage": USAGE,
                                    "choices": [{"index": 0, "message": {"role": "assistant",
                                                                         "content": self.path}}]}).encode())  # fmt: skip

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def counting_upstream() -> Iterator[int]:
    """An upstream answering every chat request with 20 tokens of usage and its path as the text."""
    with http_upstream(_Counting) as server:
        yield server.server_port


@contextmanager
def replica(config: Path, name: str) -> Iterator[str]:
    port = free_port()
    log_path = config.parent / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "KEY": KEY, "SALT": "s"})  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_ready(url, process, log_path, 60)
            yield url
        finally:
            process.terminate()
            process.wait(15)


def test_two_replicas_share_a_budget_through_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    with counting_upstream() as port:
        config = tmp_path / "router.yaml"
        config.write_text(f"""
server:
  redis: {redis_server.url}
  sessions: {{salt_env: SALT}}
  auth:
    keys: [{{name: alice, key_env: KEY, budget: {{tokens: 100, period: day}}}}]
upstreams:
  large: {{url: "http://127.0.0.1:{port}/large/v1"}}
  cheap: {{url: "http://127.0.0.1:{port}/cheap/v1"}}
policies:
  auto:
    rules:
      - {{name: saving, when: budget.used >= 0.8, route: cheap}}
      - {{name: default, route: large}}
""", encoding="utf-8")  # fmt: skip
        with replica(config, "one") as one, replica(config, "two") as two:
            auth = {"authorization": f"Bearer {KEY}"}
            request = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
            went = []
            for index in range(5):  # 20 tokens each, alternating replicas: 0, 20, 40, 60 used -> large; 80 -> cheap
                url = (one, two)[index % 2]
                answer = httpx.post(f"{url}/v1/chat/completions", json=request, headers=auth, timeout=10)
                assert answer.status_code == 200, answer.text
                went.append(answer.json()["choices"][0]["message"]["content"].split("/")[1])
            assert went == ["large", "large", "large", "large", "cheap"]
            for url in (one, two):  # 100 of 100 used: refused on either, naming the budget and when it resets
                refused = httpx.post(f"{url}/v1/chat/completions", json=request, headers=auth, timeout=10)
                assert refused.status_code == 429
                assert int(refused.headers["retry-after"]) > 0
                error = refused.json()["error"]
                assert error["code"] == "rate_limit_exceeded"
                assert error["message"].startswith(
                    "the key 'alice''s daily token budget is used up (100 of 100 tokens)"
                )
                assert "resets at" in error["message"]
    with redis_server.client() as client:
        (key,) = client.keys("d3:budget:*")
        assert key.startswith("d3:budget:key:alice:tokens:day:")
        assert float(client.get(key) or 0) == 100


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_a_token_rate_refuses_until_its_window_ends_and_a_cost_budget_counts_cost() -> None:
    clock = Clock(1_800_000_000.0)  # 2027-01-15T08:00:00Z
    budgets = Budgets(clock)
    caller = Caller("key:bob", "bob", "team", token_rate=TokenRateSpec(tokens=50, window_s=60),
                    group_budget=BudgetSpec(cost=1.0, period="month"))  # fmt: skip
    assert await budgets.check(caller) == 0.0
    await budgets.spend(caller, 30, 0.5)
    assert await budgets.check(caller) == 0.5  # the group's cost budget is half used
    await budgets.spend(caller, 30, 0.1)
    with pytest.raises(RateLimited, match=r"^the key 'bob''s token rate \(50 per 60 s\) is used up") as refused:
        await budgets.check(caller)
    assert 0 < refused.value.retry_after_s <= 60
    clock.now += 60
    assert await budgets.check(caller) == pytest.approx(0.6)  # a new minute; the month's cost stays
    await budgets.spend(caller, 1, 0.4)
    with pytest.raises(RateLimited, match=r"group 'team''s monthly cost budget .* resets at 2027-02-01T00:00:00Z$"):
        await budgets.check(caller)


def test_periods_end_at_utc_midnight_and_the_months_first() -> None:
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    day, month = limits(Caller("key:x", "x", budget=BudgetSpec(tokens=1, period="day")), now)[0], limits(
        Caller("key:x", "x", budget=BudgetSpec(tokens=1, period="month")), now)[0]  # fmt: skip
    assert (day.key, day.resets_at) == ("d3:budget:key:x:tokens:day:20270115", 1_800_000_000.0 + 16 * 3600)
    assert month.key == "d3:budget:key:x:tokens:month:202701"
    assert month.resets_at == 1_801_440_000.0  # 2027-02-01T00:00:00Z
    assert limits(Caller("anon:abc"), now) == []


@pytest.mark.anyio
async def test_a_budget_used_up_until_tomorrow_is_told_to_the_sdks_at_once() -> None:
    """Both SDKs retry a 429, sleeping its whole Retry-After (the anthropic SDK at any length): a budget that resets
    in hours says `x-should-retry: false`, so that a client with its default retries gets the error now, once."""
    config = parse_config("""
server:
  default_policy: auto
  auth: {keys: [{name: alice, key_env: ALICE_KEY, budget: {tokens: 10, period: day}}]}
upstreams: {up: {url: http://up.test/v1}}
policies: {auto: {rules: [{name: default, route: up}]}}
""")
    morning = 1_800_000_000.0  # 2027-01-15T08:00:00Z: the budget resets in 16 hours
    app = create_app(config, environ={"ALICE_KEY": "sk-alice-0123456789abcdef"}, wall_clock=lambda: morning)
    seen: list[str] = []

    async def note(request: httpx2.Request) -> None:
        seen.append(request.url.path)

    await app.budgets.spend(Caller("key:alice", "alice", budget=BudgetSpec(tokens=10, period="day")), 10, None)
    hooks = {"request": [note]}
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), event_hooks=hooks) as client:
        gpt = openai.AsyncOpenAI(base_url="http://router/v1", api_key="sk-alice-0123456789abcdef", http_client=client)
        claude = anthropic.AsyncAnthropic(base_url="http://router", api_key="sk-alice-0123456789abcdef",
                                          http_client=client)  # fmt: skip
        turn = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.RateLimitError, match="daily token budget is used up") as refused:
            await asyncio.wait_for(gpt.chat.completions.create(model="auto", messages=turn), timeout=30)  # type: ignore[arg-type]
        assert refused.value.response.headers["x-should-retry"] == "false"
        assert int(refused.value.response.headers["retry-after"]) == 16 * 3600
        with pytest.raises(anthropic.RateLimitError, match="daily token budget is used up"):
            await asyncio.wait_for(claude.messages.create(model="auto", max_tokens=5, messages=turn), timeout=30)  # type: ignore[arg-type]
    await app.aclose()
    assert seen == ["/v1/chat/completions", "/v1/messages"], "each asked once: no retry"
