"""Who may call, over a real socket with the official SDKs (issue 25): `d3router serve` with client keys, a recording
upstream, and two replicas sharing a real redis-server for the rate limit."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from d3backend import free_port
from tests.router._peers import recording_upstream, start, stop
from tests.router._redis import RedisServer

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"
CONFIG = """
server:
  auth:
    keys:
      - {{name: alice, key_env: KEY_ALICE, policies: [auto], rate: {{requests: 2, window_s: 600}}}}
      - {{name: bob, key_env: KEY_BOB, policies: [other]}}
{redis}upstreams:
  up: {{url: "http://127.0.0.1:{port}/v1", api_key_env: UPSTREAM_KEY}}
policies:
  auto: {{rules: [{{name: default, route: up}}]}}
  other: {{rules: [{{name: default, route: up}}]}}
"""
ENV = {"KEY_ALICE": ALICE, "KEY_BOB": BOB, "UPSTREAM_KEY": "sk-upstream", "SALT": "shared-salt"}


def serve(path: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(["-m", "router", "serve", str(path), "--port", str(port)], f"{url}/healthz", ENV)
    return url, process


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, list[dict[str, str]]]]:
    with recording_upstream() as (port, seen):
        path = tmp_path / "router.yaml"
        path.write_text(CONFIG.format(port=port, redis=""), encoding="utf-8")
        url, process = serve(path)
        try:
            yield url, seen
        finally:
            stop(process)


def ask(client: openai.OpenAI, model: str = "auto") -> object:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])


def test_the_sdks_raise_authentication_error_without_a_good_key(served: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = served
    for key in ("", "sk-wrong-0123456789abcdef"):
        with (
            openai.OpenAI(base_url=f"{url}/v1", api_key=key or "x", max_retries=0,
                          default_headers={"authorization": ""} if not key else None) as client,
            pytest.raises(openai.AuthenticationError) as info,
        ):  # fmt: skip
            ask(client)
        assert info.value.code == "invalid_api_key"
        with (
            anthropic.Anthropic(base_url=url, api_key=key or "x", max_retries=0) as claude,
            pytest.raises(anthropic.AuthenticationError),
        ):
            claude.messages.create(model="auto", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert seen == []


def test_a_key_uses_only_its_policies_and_the_upstream_never_sees_it(
    served: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = served
    with openai.OpenAI(base_url=f"{url}/v1", api_key=BOB, max_retries=0) as bob:
        assert [model.id for model in bob.models.list()] == ["other"]
        ask(bob, "other")
        with pytest.raises(openai.NotFoundError) as info:
            ask(bob, "auto")
    assert info.value.code == "model_not_found"
    hi = [{"role": "user", "content": "hi"}]
    with anthropic.Anthropic(base_url=url, api_key=BOB, max_retries=0) as claude:
        claude.messages.with_raw_response.create(model="other", max_tokens=5, messages=hi)  # type: ignore[arg-type]
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.create(model="auto", max_tokens=5, messages=hi)  # type: ignore[arg-type]
    assert len(seen) == 2
    for headers in seen:
        lowered = {k.lower(): v for k, v in headers.items()}
        assert BOB not in str(lowered)
        assert lowered.get("authorization") == "Bearer sk-upstream" or lowered.get("x-api-key") == "sk-upstream"


def test_the_rate_limit_holds_across_two_replicas_sharing_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    with recording_upstream() as (port, seen):
        path = tmp_path / "router.yaml"
        redis = f"  redis: {redis_server.url}\n  sessions: {{salt_env: SALT}}\n"
        path.write_text(CONFIG.format(port=port, redis=redis), encoding="utf-8")
        (first, one), (second, two) = serve(path), serve(path)
        try:
            with (
                openai.OpenAI(base_url=f"{first}/v1", api_key=ALICE, max_retries=0) as one_client,
                openai.OpenAI(base_url=f"{second}/v1", api_key=ALICE, max_retries=0) as two_client,
            ):
                ask(one_client)
                ask(two_client)
                for client in (one_client, two_client):
                    with pytest.raises(openai.RateLimitError) as info:
                        ask(client)
                    assert info.value.code == "rate_limit_exceeded"
                    assert int(info.value.response.headers["retry-after"]) > 0
            assert len(seen) == 2
        finally:
            stop(one)
            stop(two)


def test_serve_refuses_redis_without_its_salt(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(port=9, redis="  redis: redis://127.0.0.1:9/0\n  sessions: {salt_env: NOPE}\n"),
                    encoding="utf-8")  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "router", "serve", str(path), "--port", str(free_port())],
                            capture_output=True, text=True, timeout=60, env={**os.environ, **ENV})  # fmt: skip
    assert result.returncode == 2
    assert "set server.sessions.salt_env to a variable holding a secret salt" in result.stderr
