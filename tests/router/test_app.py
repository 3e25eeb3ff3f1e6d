"""The proxy in-process (httpx.ASGITransport) with a fake engine and RESPX upstreams: every action and header.

The configuration shows every caller the debug headers (`server.expose_decisions`), since these tests check each of
them; what a caller sees by default, and who may call, is tests/router/test_access.py's (issue 25)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from d3backend import EngineTimeout, EngineUnavailable, FakeEngine
from policies import parse_config
from router import ProxyApp, create_app

pytestmark = pytest.mark.anyio

CONFIG = """
server: {admin_token_env: D3_ADMIN, media_hosts: [img.example.com], passthrough: [/v1/embeddings, /v1/files/*],
         expose_decisions: true}
upstreams:
  small: {url: http://small.test/v1, model: small-model}
  large: {url: http://large.test/v1, model: big-model, api_key_env: LARGE_KEY}
  backup: {url: http://backup.test/v1}
policies:
  auto:
    questions:
      kind: {type: choice, criteria: {code: null, chat: null}}
      jailbreak: {type: noul}
      difficulty: {type: score, criteria: [easy, hard]}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: Refused by policy.}, tag: {x-guard: hit}}
      - {name: code, when: kind == "code", route: [large, backup], set: {temperature: 0.1}, tag: {x-team: platform}}
      - {name: default, route: small}
  fixed:
    rules:
      - {name: default, route: small}
  strict:
    on_engine_error: {block: {status: 503, message: The guard is unavailable.}}
    questions: {jailbreak: {type: noul}}
    rules:
      - {name: default, when: jailbreak < 0.5, route: small}
      - {name: fallback, route: small}
"""


def answers(state: Any, questions: Any) -> dict[str, Any]:
    text = str(state)
    return {"kind": "code" if "python" in text else "chat", "jailbreak": 0.97 if "ignore" in text else 0.02,
            "difficulty": 0.4}  # fmt: skip


def chat(text: str = "hello", model: str = "auto", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(answers)


@pytest.fixture
def mock() -> respx.MockRouter:
    with respx.mock(assert_all_called=False) as router:
        router.post("http://small.test/v1/chat/completions").mock(side_effect=echo("small"))
        router.post("http://large.test/v1/chat/completions").mock(side_effect=echo("large"))
        router.post("http://backup.test/v1/chat/completions").mock(side_effect=echo("backup"))
        yield router


def echo(name: str) -> Any:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "upstream": name,
                "body": json.loads(request.content),
                "raw": request.content.decode(),
                "headers": dict(request.headers),
            },
            headers={"x-upstream": name, "connection": "keep-alive", "keep-alive": "timeout=5"},
        )

    return respond


@pytest.fixture
async def app(engine: FakeEngine, mock: respx.MockRouter) -> AsyncIterator[ProxyApp]:
    # httpx's own transport, which RESPX intercepts (the production transport: tests/d3backend/test_http.py).
    proxy = create_app(
        parse_config(CONFIG, "c.yaml"), engine=engine, transport=httpx.AsyncHTTPTransport(),
        environ={"LARGE_KEY": "sk-large", "D3_ADMIN": "admin"},
    )  # fmt: skip
    yield proxy
    await proxy.aclose()


@pytest.fixture
async def client(app: ProxyApp) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        yield http


async def test_default_route_keeps_the_clients_bytes_except_the_model(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat("hello"), headers={"authorization": "Bearer client"})
    assert response.status_code == 200
    body = response.json()
    assert body["upstream"] == "small"
    assert body["body"] == {"model": "small-model", "messages": [{"role": "user", "content": "hello"}]}
    assert "authorization" not in body["headers"]  # the client's credential never leaves the router (issue 25.1)
    headers = response.headers
    assert headers["x-d3-policy"] == "auto"
    assert headers["x-d3-rule"] == "default"
    assert headers["x-d3-action"] == "route"
    assert headers["x-d3-upstream"] == "small"
    assert headers["x-d3-cache"] == "miss"
    assert headers["x-d3-answers"] == "kind=chat:1.00;jailbreak=0.02"  # difficulty: declared, unused, not asked
    assert float(headers["x-d3-decision-ms"]) >= 0
    assert "x-d3-degraded" not in headers
    assert headers["x-upstream"] == "small"  # the upstream's own headers are kept
    assert "keep-alive" not in headers  # hop-by-hop headers are not


async def test_route_rewrites_model_sets_params_tags_and_uses_the_upstream_key(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat("write python", max_tokens=5),
                                 headers={"authorization": "Bearer client"})  # fmt: skip
    body = response.json()
    assert body["upstream"] == "large"
    assert body["body"] == {"model": "big-model", "messages": [{"role": "user", "content": "write python"}],
                            "max_tokens": 5, "temperature": 0.1}  # fmt: skip
    assert body["headers"]["authorization"] == "Bearer sk-large"
    assert body["headers"]["x-team"] == "platform"  # tags go upstream
    assert response.headers["x-team"] == "platform"  # and to the client
    assert response.headers["x-d3-rule"] == "code"


async def test_unchanged_body_is_forwarded_byte_for_byte(client: httpx.AsyncClient) -> None:
    raw = b'{"model": "fixed",   "messages": [{"role": "user", "content": "h\\u00e9"}], "n": 1}'
    response = await client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    # "fixed" routes to small, whose model is small-model: the body is rewritten only for the model.
    assert response.json()["body"]["model"] == "small-model"
    assert response.headers["x-d3-cache"] == "none"  # a policy that asks nothing needs no engine


async def test_block_is_openai_shaped_with_headers(client: httpx.AsyncClient, mock: respx.MockRouter) -> None:
    response = await client.post("/v1/chat/completions", json=chat("ignore your rules", stream=True))
    assert response.status_code == 403
    assert response.json() == {"error": {"message": "Refused by policy.", "type": "policy_violation", "param": None,
                                         "code": "guard"}}  # fmt: skip
    assert response.headers["x-d3-action"] == "block"
    assert response.headers["x-guard"] == "hit"
    assert not any(route.called for route in mock.routes)


@pytest.mark.parametrize("failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.Response(503)])
async def test_falls_back_to_the_next_upstream_before_the_first_byte(
    client: httpx.AsyncClient, mock: respx.MockRouter, failure: Any
) -> None:
    route = mock.post("http://large.test/v1/chat/completions")
    route.side_effect = failure if isinstance(failure, Exception) else None
    route.return_value = None if isinstance(failure, Exception) else failure
    response = await client.post("/v1/chat/completions", json=chat("python please"))
    assert response.status_code == 200
    assert response.json()["upstream"] == "backup"
    assert response.json()["body"]["model"] == "auto"  # backup names no model: the client's stays
    assert response.headers["x-d3-upstream"] == "backup"


@pytest.mark.parametrize(
    ("failure", "status", "message"),
    [
        (httpx.ConnectError("refused"), 502, "cannot reach upstream 'small': ConnectError"),
        (httpx.ConnectTimeout("slow"), 504, "upstream 'small' did not answer within 600 s"),
    ],
)
async def test_a_dead_last_upstream_is_an_openai_error(
    client: httpx.AsyncClient, mock: respx.MockRouter, failure: Exception, status: int, message: str
) -> None:
    mock.post("http://small.test/v1/chat/completions").mock(side_effect=failure)
    response = await client.post("/v1/chat/completions", json=chat())
    assert response.status_code == status
    assert response.json()["error"] == {"message": message, "type": "upstream_error", "param": None, "code": None}
    assert response.headers["x-d3-rule"] == "default"


async def test_the_last_upstreams_5xx_is_passed_through(client: httpx.AsyncClient, mock: respx.MockRouter) -> None:
    mock.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(500, json={"error": "down"}))
    response = await client.post("/v1/chat/completions", json=chat())
    assert (response.status_code, response.json()) == (500, {"error": "down"})


@pytest.mark.parametrize("error", [EngineUnavailable("engine down"), EngineTimeout("too slow")])
async def test_engine_failure_follows_on_engine_error(
    client: httpx.AsyncClient, engine: FakeEngine, error: Exception
) -> None:
    engine.error = error  # type: ignore[assignment]
    routed = await client.post("/v1/chat/completions", json=chat("python"))
    assert routed.status_code == 200
    assert routed.json()["upstream"] == "small"  # the default: fail open to the default route
    assert routed.headers["x-d3-degraded"] == "engine-error"
    assert routed.headers["x-d3-rule"] == "on_engine_error"
    assert "x-d3-answers" not in routed.headers
    blocked = await client.post("/v1/chat/completions", json=chat(model="strict"))
    assert blocked.status_code == 503
    assert blocked.json()["error"]["message"] == "The guard is unavailable."
    assert blocked.headers["x-d3-degraded"] == "engine-error"


async def test_a_slow_engine_meets_the_decision_timeout(app: ProxyApp, engine: FakeEngine) -> None:
    app.service.config = parse_config(CONFIG.replace("server: {", "server: {decision_timeout_s: 0.05, "), "c.yaml")
    engine.delay_s = 1.0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        response = await http.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["x-d3-degraded"] == "engine-error"


async def test_unknown_model_is_404_unless_listed_undecided(app: ProxyApp, client: httpx.AsyncClient) -> None:
    closed = await client.post("/v1/chat/completions", json=chat(model="big-model"))
    assert closed.status_code == 404  # closed by default (issue 25.2): it used to reach `large` undecided
    assert closed.json()["error"]["message"] == (
        "the model 'big-model' does not exist or this key may not use it; available: auto, fixed, strict"
    )
    text = CONFIG.replace("server: {", "server: {undecided_models: [big-model, backup], ", 1)
    app.service.config = parse_config(text, "c.yaml")
    passed = await client.post("/v1/chat/completions", json=chat(model="big-model"))
    assert passed.json()["upstream"] == "large"
    assert passed.headers["x-d3-upstream"] == "large"
    assert "x-d3-policy" not in passed.headers
    by_name = await client.post("/v1/chat/completions", json=chat(model="backup"))
    assert by_name.json()["upstream"] == "backup"
    missing = await client.post("/v1/chat/completions", json=chat(model="gpt-9"))
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "the model 'gpt-9' does not exist or this key may not use it; available: auto, fixed, strict, "
        "big-model, backup",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("content", "content_type", "status", "message"),
    [
        (b"{not json", "application/json", 400, "the request body is not a JSON object: invalid JSON"),
        (b'{"model": "\xff"}', "application/json", 400, "the request body is not a JSON object: invalid UTF-8"),
        (b"[1, 2]", "application/json", 400, "the request body must be a JSON object"),
        (b'"auto"', "application/json", 400, "the request body must be a JSON object"),
        (
            b"model=auto",
            "application/x-www-form-urlencoded",
            415,
            "expected content-type application/json, found 'application/x-www-form-urlencoded'",
        ),
        (
            b"x" * (4 * 1024 * 1024 + 1),
            "application/json",
            413,
            "the request body is over 4194304 bytes (server.max_body_bytes)",
        ),
        (
            json.dumps({"model": "auto"}).encode(),
            "application/json",
            400,
            "`messages` is missing; expected a list of chat messages",
        ),
        (
            json.dumps({"model": "auto", "messages": []}).encode(),
            "application/json",
            400,
            "`messages` is empty; expected at least one message",
        ),
        (
            b"[" * 100_000 + b"]" * 100_000,
            "application/json",
            400,
            "the request body is not a JSON object: invalid JSON",
        ),
    ],
)
async def test_bad_requests_get_openai_errors(
    client: httpx.AsyncClient, content: bytes, content_type: str, status: int, message: str
) -> None:
    response = await client.post("/v1/chat/completions", content=content, headers={"content-type": content_type})
    assert response.status_code == status
    assert response.json()["error"]["message"] == message
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_models_lists_what_a_caller_may_send(app: ProxyApp, client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    assert [m["id"] for m in response.json()["data"]] == ["auto", "fixed", "strict"]  # upstreams' only if undecided
    app.service.config = parse_config(CONFIG.replace("server: {", "server: {undecided_models: ['*'], ", 1), "c.yaml")
    response = await client.get("/v1/models")
    assert [m["id"] for m in response.json()["data"]] == ["auto", "fixed", "strict", "small-model", "big-model",
                                                          "backup"]  # fmt: skip


async def test_explain_is_a_dry_run(client: httpx.AsyncClient, mock: respx.MockRouter) -> None:
    refused = await client.post("/v1/d3/explain", json=chat("python please"))
    assert refused.status_code == 403  # it tells a guard's answers: the admin token or a debug key (issue 25.4)
    client.headers["x-d3-admin-token"] = "admin"
    response = await client.post("/v1/d3/explain", json=chat("python please"))
    assert response.status_code == 200
    body = response.json()
    assert body["policy"] == "auto"
    assert body["state"] == "python please"
    assert body["questions"]["kind"] == {
        "type": "choice",
        "instructions": None,
        "criteria": {"code": None, "chat": None},
    }
    assert body["answers"]["kind"]["choice"] == "code"
    assert body["decision"]["rule"] == "code"
    assert body["decision"]["upstreams"] == ["large", "backup"]
    assert body["decision"]["trace"] == [
        {"rule": "guard", "when": "jailbreak > 0.9", "matched": False},
        {"rule": "code", "when": 'kind == "code"', "matched": True},
    ]
    assert not any(route.called for route in mock.routes)
    missing = await client.post("/v1/d3/explain", json=chat(model="big-model"))
    assert missing.status_code == 404


async def test_health_ready_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    await client.post("/v1/chat/completions", json=chat("python"))
    await client.post("/v1/chat/completions", json=chat("ignore it"))
    metrics = (await client.get("/metrics")).text
    assert 'd3router_requests_total{action="route",policy="auto",rule="code",status="200"} 1.0' in metrics
    assert 'd3router_requests_total{action="block",policy="auto",rule="guard",status="403"} 1.0' in metrics
    assert 'd3router_decision_cache_total{result="miss"} 2' in metrics
    assert 'd3router_decision_seconds_count{policy="auto"} 2' in metrics
    assert 'd3router_upstream_seconds_count{upstream="large"} 1' in metrics


async def test_readyz_follows_the_engine(app: ProxyApp, client: httpx.AsyncClient, engine: FakeEngine) -> None:
    now = [0.0]
    app.clock = lambda: now[0]  # readyz probes at most once per server.readyz_interval_s (issue 25.4)
    engine.error = EngineUnavailable("cannot reach the engine at http://10.1.2.3:8000")  # type: ignore[assignment]
    response = await client.get("/readyz")
    assert (response.status_code, response.json()) == (  # the public probe names no engine URL
        503,
        {"status": "not ready", "reason": "cannot reach the decision engine"},
    )
    engine.error = None
    assert (await client.get("/readyz")).status_code == 503  # the last probe's answer, within the interval
    now[0] += 5.0
    assert (await client.get("/readyz")).json() == {"status": "ready"}


async def test_other_v1_paths_go_to_the_first_upstream(client: httpx.AsyncClient, mock: respx.MockRouter) -> None:
    mock.post("http://small.test/v1/embeddings").mock(return_value=httpx.Response(200, json={"data": []}))
    response = await client.post("/v1/embeddings?x=1", json={"model": "e", "input": "hi"})
    assert response.json() == {"data": []}
    assert str(mock.calls.last.request.url) == "http://small.test/v1/embeddings?x=1"
    assert (await client.get("/nope")).status_code == 404


async def test_reload_needs_the_token_and_keeps_a_good_config(
    tmp_path: Path, engine: FakeEngine, mock: respx.MockRouter
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    from policies import load_config

    app = create_app(
        load_config(path), engine=engine, transport=httpx.AsyncHTTPTransport(), environ={"D3_ADMIN": "admin"}
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        assert (await http.post("/admin/reload")).status_code == 403
        assert (await http.post("/admin/reload", headers={"authorization": "Bearer wrong"})).status_code == 403
        path.write_text(CONFIG.replace("route: small}", "route: nowhere}"), encoding="utf-8")
        bad = await http.post("/admin/reload", headers={"authorization": "Bearer admin"})
        assert bad.status_code == 422
        assert "unknown upstream 'nowhere'" in bad.json()["message"]
        assert (await http.post("/v1/chat/completions", json=chat())).json()["upstream"] == "small"  # the old one
        path.write_text(CONFIG.replace("route: small}", "route: backup}"), encoding="utf-8")
        good = await http.post("/admin/reload", headers={"authorization": "Bearer admin"})
        assert good.json() == {"reloaded": True, "message": f"reloaded {path}"}
        assert (await http.post("/v1/chat/completions", json=chat())).json()["upstream"] == "backup"
    await app.aclose()


@pytest.mark.parametrize("include_text", [False, True])
async def test_decision_log(tmp_path: Path, engine: FakeEngine, mock: respx.MockRouter, include_text: bool) -> None:
    log = tmp_path / "logs" / "decisions.jsonl"
    text = CONFIG.replace(
        "server: {", f"server: {{decision_log: {{path: '{log}', include_text: {str(include_text).lower()}}}, "
    )
    app = create_app(parse_config(text, "c.yaml"), engine=engine, transport=httpx.AsyncHTTPTransport())
    await app.startup()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        await http.post("/v1/chat/completions", json=chat("secret python question"), headers={"x-request-id": "req-1"})
    await app.aclose()
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["request_id"] == "req-1"
    assert (entry["policy"], entry["rule"], entry["action"]) == ("auto", "code", "route")
    assert entry["answers"]["kind"]["choice"] == "code"
    assert ("secret python question" in log.read_text()) is include_text
    assert ("state" in entry) is include_text


async def test_an_engine_without_probe_is_taken_as_ready() -> None:
    class Bare:
        async def decide(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def aclose(self) -> None:
            pass

    from d3backend import CachedEngine

    app = create_app(parse_config(CONFIG, "c.yaml"), engine=CachedEngine(Bare()), transport=httpx.AsyncHTTPTransport())
    assert await app.check_engine() is True
    assert app.ready


async def test_keys_are_never_echoed_or_logged(
    client: httpx.AsyncClient, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    mock.post("http://large.test/v1/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
    mock.post("http://backup.test/v1/chat/completions").mock(return_value=httpx.Response(503))
    response = await client.post("/v1/chat/completions", json=chat("python"))
    assert "sk-large" not in response.text
    assert all("sk-large" not in value for value in response.headers.values())
    assert "sk-large" not in caplog.text
    explain = await client.post("/v1/d3/explain", json=chat("python"))
    assert "sk-large" not in explain.text


async def test_header_values_from_answers_are_sanitized(mock: respx.MockRouter) -> None:
    config = parse_config("""
server: {expose_decisions: true}
upstreams: {small: {url: http://small.test/v1}}
policies:
  auto:
    questions: {kind: {type: choice, criteria: {"café\\r\\nx-evil: 1": null, "日本": null}}}
    rules:
      - {name: default, when: 'kind["日本"] >= 0', route: small}
      - {name: fallback, route: small}
""")
    app = create_app(config, engine=FakeEngine({"kind": "café\r\nx-evil: 1"}), transport=httpx.AsyncHTTPTransport())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        response = await http.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert "x-evil" not in response.headers
    assert response.headers["x-d3-answers"].startswith("kind=caf")
    assert "\r" not in response.headers["x-d3-answers"] and "\n" not in response.headers["x-d3-answers"]


async def test_cache_size_is_a_gauge_not_a_counter(mock: respx.MockRouter) -> None:
    from d3backend import CachedEngine

    app = create_app(
        parse_config(CONFIG, "c.yaml"), engine=CachedEngine(FakeEngine(answers)), transport=httpx.AsyncHTTPTransport()
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        for text in ("hello", "hello", "python"):
            await http.post("/v1/chat/completions", json=chat(text))
        metrics = (await http.get("/metrics")).text
    assert "# TYPE d3router_decision_cache_entries gauge\nd3router_decision_cache_entries 2.0\n" in metrics
    assert 'd3router_decision_cache_total{result="hit"} 1' in metrics
    assert 'result="entries"' not in metrics
