"""Usage through a real upstream (issue 29.2, done when): `d3router serve` in front of a real vLLM, each API streamed
and not. The tokens the router counts (its decision-log line, its metrics) equal what vLLM reported, and the client
gets exactly what it would from vLLM directly: the same events, and no usage chunk it did not ask for."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from d3backend import VllmServer, free_port
from tests.conftest import SERVED_MODEL
from tests.router._peers import wait_until_ready

pytestmark = pytest.mark.engine

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}  # fmt: skip
# What differs between two runs of one request whatever the router does: ids, times, the model's name.
# vLLM may join tokens into one delta when it streams faster than it detokenizes: deltas (and the sequence numbers
# counting them) are compared as the text they add up to.
VOLATILE = frozenset({"id", "created", "created_at", "item_id", "model", "system_fingerprint", "response_id",
                      "sequence_number"})  # fmt: skip


@pytest.fixture(scope="module")
def router(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("usage")
    config = folder / "router.yaml"
    config.write_text(
        f"""
server: {{decision_log: {{path: decisions.jsonl}}}}
upstreams:
  local: {{url: "{vllm_server.url}/v1", model: {SERVED_MODEL}, price: {{input: 2.0, output: 8.0}}}}
policies:
  auto:
    rules:
      - {{name: default, route: local}}
""",
        encoding="utf-8",
    )
    port = free_port()
    log = open(folder / "router.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, folder / "router.log", 60)
        yield url, folder / "decisions.jsonl"
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def body(api: str, model: str, stream: bool, **extra: Any) -> dict[str, Any]:
    asked: dict[str, Any] = {"model": model, "stream": stream, "temperature": 0, **extra}
    text = "Count from one to five."
    if api == "completions":
        return {**asked, "prompt": text, "max_tokens": 8}
    if api == "responses":
        return {**asked, "input": text, "max_output_tokens": 8}
    return {**asked, "messages": [{"role": "user", "content": text}], "max_tokens": 8}


def post(url: str, api: str, payload: dict[str, Any]) -> bytes:
    response = httpx.post(url + PATHS[api], json=payload, timeout=60)
    assert response.status_code == 200, response.text
    return response.content


def stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def events(raw: bytes) -> list[tuple[str, Any]]:
    """The stream's events as (event name, data without what differs between runs)."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.split(b"\n")
        name = b"".join(line[6:].strip() for line in lines if line.startswith(b"event:")).decode()
        data = b"\n".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
        out.append((name, data.decode() if data == b"[DONE]" else stable(json.loads(data))))
    return out


def delta(data: Any) -> str | None:
    """The text a delta event adds (chat, completions, Responses, Messages), or None for any other event."""
    if not isinstance(data, dict):
        return None
    choices = data.get("choices") or [{}]
    choice = choices[0]
    if choice.get("finish_reason") is None and set(choice.get("delta", {})) == {"content"}:
        return str(choice["delta"]["content"])
    if data.get("object") == "text_completion" and choice.get("finish_reason") is None and "text" in choice:
        return str(choice["text"])
    if data.get("type") == "response.output_text.delta":
        return str(data["delta"])
    if data.get("type") == "content_block_delta" and data["delta"].get("type") == "text_delta":
        return str(data["delta"]["text"])
    return None


def shape(raw: bytes) -> list[tuple[str, Any]]:
    """The stream's events, each run of text deltas joined into one. vLLM cuts a stream's text where its engine
    happened to be when the API server read it (under load several tokens come as one delta, the last ones with the
    finishing chunk), so the finishing chunk's text joins the run and the chunk is kept without it."""
    out: list[tuple[str, Any]] = []
    for name, data in events(raw):
        text, rest = delta(data), None
        if text is None:
            text, rest = finishing_text(data)
        if text is None:
            out.append((name, data))
            continue
        if out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + text)
        else:
            out.append(("text", text))
        if rest is not None:
            out.append((name, rest))
    return out


def finishing_text(data: Any) -> tuple[str | None, Any]:
    """A chat or completions chunk with a `finish_reason`: the text it carries, and the chunk without it."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or choices[0].get("finish_reason") is None:
        return None, None
    choice = dict(choices[0])
    if "text" in choice:
        text, choice["text"] = str(choice["text"]), ""
    elif isinstance(choice.get("delta"), dict) and isinstance(choice["delta"].get("content"), str):
        text, choice["delta"] = choice["delta"]["content"], {**choice["delta"], "content": ""}
    else:
        return None, None
    return text, {**data, "choices": [choice, *choices[1:]]}


def reported(api: str, usage: dict[str, Any]) -> dict[str, int]:
    """vLLM's usage, as the router counts it (input with its cached part, output)."""
    if api in ("chat", "completions"):
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return {"input": usage["prompt_tokens"], "cached": cached, "output": usage["completion_tokens"]}
    if api == "responses":
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        return {"input": usage["input_tokens"], "cached": cached, "output": usage["output_tokens"]}
    read = usage.get("cache_read_input_tokens") or 0
    total = usage["input_tokens"] + read + (usage.get("cache_creation_input_tokens") or 0)
    return {"input": total, "cached": read, "output": usage["output_tokens"]}


def stream_usage(api: str, raw: bytes) -> dict[str, Any]:
    """The usage a stream reported: the usage chunk, `response.completed`, or message_start with message_delta."""
    found: dict[str, Any] = {}
    for _, data in events(raw):
        if not isinstance(data, dict):
            continue
        if api in ("chat", "completions") and data.get("usage"):
            found = data["usage"]
        elif api == "responses" and data.get("type") == "response.completed":
            found = data["response"]["usage"]
        elif api == "messages" and data.get("type") == "message_start":
            found = dict(data["message"]["usage"])
        elif api == "messages" and data.get("type") == "message_delta":
            found.update(data["usage"])
    return found


def last_line(log: Path, count: int) -> dict[str, Any]:
    """The decision log's line number `count` (1-based), once written (a thread writes it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= count:
            return dict(json.loads(lines[count - 1]))
        time.sleep(0.05)
    pytest.fail(f"the decision log has no line {count}")


def lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("api", list(PATHS))
@pytest.mark.parametrize("stream", [False, True])
def test_tokens_counted_equal_vllms_and_the_client_sees_what_it_would(
    router: tuple[str, Path], vllm_server: VllmServer, api: str, stream: bool
) -> None:
    url, log = router
    direct = post(vllm_server.url, api, body(api, SERVED_MODEL, stream))
    before = lines(log)
    shown = post(url, api, body(api, "auto", stream))
    line = last_line(log, before + 1)
    assert line["upstream"] == "local"
    if not stream:
        answer, plain = json.loads(shown), json.loads(direct)
        assert stable(answer) == stable(plain)
        assert line["usage"] == reported(api, answer["usage"])
    else:
        assert shape(shown) == shape(direct)  # the same events: none added (no usage chunk), none missing
        usage = stream_usage(api, direct)
        if api in ("chat", "completions"):  # the client did not ask: vLLM's count from the same request, asked
            assert not usage
            usage = stream_usage(
                api, post(vllm_server.url, api, body(api, SERVED_MODEL, True, stream_options={"include_usage": True}))
            )
        assert line["usage"] == reported(api, usage)
    assert line["usage"]["output"] > 0
    assert line["cost"] == pytest.approx((line["usage"]["input"] * 2.0 + line["usage"]["output"] * 8.0) / 1e6)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_stream_that_asks_for_usage_gets_vllms_own(router: tuple[str, Path], api: str) -> None:
    url, log = router
    before = lines(log)
    shown = post(url, api, body(api, "auto", True, stream_options={"include_usage": True}))
    usage = stream_usage(api, shown)
    assert usage
    assert last_line(log, before + 1)["usage"] == reported(api, usage)
    metrics = httpx.get(url + "/metrics").text
    assert 'd3router_upstream_tokens_total{group="-",key="-",kind="output",policy="auto",rule="default",' \
           'upstream="local"}' in metrics  # fmt: skip
