"""`build_engine`: the engine a configuration describes, behind the decision cache unless it is turned off."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import respx

import router._decision.engines
from d3backend import CachedEngine, EmbeddedEngine, FakeEngine, RemoteEngine
from policies import EngineSettings, parse_config
from router import build_engine, create_app

pytestmark = pytest.mark.anyio

BASE = Path("/srv/d3")


def settings(text: str) -> EngineSettings:
    config = parse_config(f"engine: {text}\nupstreams: {{small: {{url: http://small.test/v1}}}}\n"
                          "policies: {fixed: {rules: [{name: default, route: small}]}}\n")  # fmt: skip
    return config.engine


async def test_a_remote_engine_is_built_from_its_settings_behind_the_cache() -> None:
    engine = build_engine(
        settings("{remote: {urls: ['http://d3-a:8000', 'http://d3-b:8000/'], model: d3-mini, api_key_env: D3_KEY},"
                 " cache: {max_entries: 7, ttl_s: 30}}"),
        base_dir=BASE, environ={"D3_KEY": "sk-engine"},
    )  # fmt: skip
    try:
        assert isinstance(engine, CachedEngine)
        inner = engine.engine
        assert isinstance(inner, RemoteEngine)
        assert inner.urls == ("http://d3-a:8000", "http://d3-b:8000")
        assert inner.model == engine.model == "d3-mini"
        assert inner._headers["authorization"] == "Bearer sk-engine"
        assert engine._cache.maxsize == 7
        assert engine._cache.ttl == 30
    finally:
        await engine.aclose()


async def test_a_missing_key_variable_sends_no_key() -> None:
    engine = build_engine(settings("{remote: {urls: ['http://d3-a:8000'], api_key_env: D3_KEY}}"), base_dir=BASE,
                          environ={})  # fmt: skip
    try:
        assert isinstance(engine, CachedEngine) and isinstance(engine.engine, RemoteEngine)
        assert "authorization" not in engine.engine._headers
    finally:
        await engine.aclose()


async def test_max_entries_zero_keeps_no_answers_but_single_flight() -> None:
    engine = build_engine(settings("{remote: {urls: ['http://d3-a:8000']}, cache: {max_entries: 0}}"), base_dir=BASE,
                          environ={})  # fmt: skip
    try:
        assert isinstance(engine.engine, RemoteEngine)
        assert not engine._keeps and engine.shared is None
    finally:
        await engine.aclose()


def test_the_default_engine_is_embedded_d3_mini_behind_the_cache() -> None:
    engine = build_engine(settings("{}"), base_dir=BASE, environ={})  # nothing starts until start()
    assert isinstance(engine, CachedEngine)
    inner = engine.engine
    assert isinstance(inner, EmbeddedEngine)
    assert inner.model == "vllm-sr/d3-mini"
    assert inner.argv[:6] == ["--model", "vllm-sr/d3-mini", "--served-model-name", "vllm-sr/d3-mini", "--dtype",
                              "auto"]  # fmt: skip
    assert "--max-model-len" not in inner.argv
    assert "--kv-cache-memory-bytes" not in inner.argv


@pytest.mark.parametrize(
    ("model", "expected"),
    [("./models/tiny", str(BASE / "models" / "tiny")), ("../tiny", str(BASE.parent / "tiny")),
     ("/abs/tiny", "/abs/tiny"), ("org/name", "org/name")],
)  # fmt: skip
def test_an_embedded_engine_takes_its_settings_and_a_model_relative_to_the_file(model: str, expected: str) -> None:
    engine = build_engine(
        settings(f"{{embedded: {{model: '{model}', served_model_name: tiny, max_model_len: 512, dtype: float32,"
                 " kv_cache_memory_bytes: 64M, args: [--seed, '7'], timeout_s: 4.5}, cache: {max_entries: 0}}"),
        base_dir=BASE, environ={},
    )  # fmt: skip
    inner = engine.engine
    assert isinstance(inner, EmbeddedEngine)
    assert inner.model == "tiny"
    argv = inner.argv
    assert argv[:6] == ["--model", expected, "--served-model-name", "tiny", "--dtype", "float32"]
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "64M"
    assert argv[-2:] == ["--seed", "7"]  # extra arguments last: vLLM's parser keeps a repeated flag's last value
    assert inner._timeout_s == 4.5


# --- the cache is really in front of the engine the app builds -------------------------------------------------
class CountingRemote(FakeEngine):
    """Stands in for RemoteEngine inside build_engine: answers from a table and counts its calls."""

    built: ClassVar[list[CountingRemote]] = []

    def __init__(self, urls: Any, **kwargs: Any) -> None:
        super().__init__({"j": 0.1})
        CountingRemote.built.append(self)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[CountingRemote]]:
    CountingRemote.built = []
    monkeypatch.setattr(router._decision.engines, "RemoteEngine", CountingRemote)
    yield CountingRemote.built


# expose_decisions: the tests read x-d3-cache, which a caller sees only with it or a debug key (issue 25.4).
COUNTED = """
server: {{expose_decisions: true}}
engine: {{remote: {{urls: ['http://d3.test:8000']}}, cache: {{max_entries: {entries}}}}}
upstreams: {{small: {{url: http://small.test/v1}}}}
policies:
  auto:
    questions: {{j: {{type: noul}}}}
    rules:
      - {{name: guard, when: j > 0.9, block: {{status: 403, message: no}}}}
      - {{name: default, route: small}}
"""
BODY = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


async def send(entries: int, counting: list[CountingRemote], *batches: int) -> list[list[httpx.Response]]:
    """Batches of identical requests, each batch sent together, to an app whose engine (counted) is built from a
    configuration keeping `entries` answers."""
    with respx.mock() as mock:
        mock.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={"ok": True}))
        app = create_app(parse_config(COUNTED.format(entries=entries)), transport=httpx.AsyncHTTPTransport())
        [engine] = counting
        engine.delay_s = 0.05  # long enough for a batch to be in flight together
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
                return [
                    list(await asyncio.gather(*(http.post("/v1/chat/completions", json=BODY) for _ in range(size))))
                    for size in batches
                ]
        finally:
            await app.aclose()


async def test_repeated_requests_reach_the_configured_engine_once(counting: list[CountingRemote]) -> None:
    [first], [second] = await send(10_000, counting, 1, 1)
    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.headers["x-d3-cache"], second.headers["x-d3-cache"]) == ("miss", "hit")
    [engine] = counting
    assert len(engine.calls) == 1, "the second, identical request was not answered from the decision cache"
    assert engine.closed  # the app owns the engine it built, and closes it through the cache


async def test_with_the_cache_off_identical_requests_in_flight_share_one_engine_call(
    counting: list[CountingRemote],
) -> None:
    together, [later] = await send(0, counting, 8, 1)
    assert [response.status_code for response in together] == [200] * 8
    assert {response.headers["x-d3-cache"] for response in [*together, later]} == {"miss"}  # nothing is kept
    [engine] = counting
    assert len(engine.calls) == 2, "identical decisions in flight did not share one engine call with the cache off"
