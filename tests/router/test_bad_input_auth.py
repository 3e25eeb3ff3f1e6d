"""The bad-input corpus, authentication attacks (issue 25): missing, malformed, repeated or conflicting
`Authorization` / `x-api-key`, keys in the query string, 100 KB keys, NUL/CR/LF, wrong schemes. Each is a 401 (or a
400), never a 5xx, never an upstream call, never the engine, on every decided path and on both faces."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from d3backend import FakeEngine
from policies import parse_config
from router import D3RouterMiddleware, create_app

pytestmark = pytest.mark.anyio

KEY = "sk-good-0123456789abcdef"
CONFIG = """
server: {auth: {keys: [{name: good, key_env: GOOD}]}, passthrough: [/v1/embeddings]}
upstreams: {small: {url: http://small.test/v1, api_key_env: UP}}
policies: {auto: {questions: {j: {type: noul}}, rules: [{name: g, when: j > 0.5, route: small}, {name: d, route: small}]}}
"""
ENVIRON = {"GOOD": KEY, "UP": "sk-upstream"}

Headers = list[tuple[bytes, bytes]]
A, X = b"authorization", b"x-api-key"
GOOD = KEY.encode()
CASES: list[tuple[str, Headers, bytes]] = [
    ("none", [], b""),
    ("empty-authorization", [(A, b"")], b""),
    ("bearer-only", [(A, b"Bearer")], b""),
    ("bearer-space", [(A, b"Bearer ")], b""),
    ("bearer-wrong", [(A, b"Bearer sk-wrong-0123456789abcdef")], b""),
    ("bearer-prefix-of-key", [(A, b"Bearer " + GOOD[:-1])], b""),
    ("bearer-key-plus-one", [(A, b"Bearer " + GOOD + b"x")], b""),
    ("bearer-key-upper", [(A, b"Bearer " + GOOD.upper())], b""),
    ("basic-scheme", [(A, b"Basic " + GOOD)], b""),
    ("token-scheme", [(A, b"Token " + GOOD)], b""),
    ("no-scheme", [(A, GOOD)], b""),
    ("digest-scheme", [(A, b'Digest username="good"')], b""),
    ("bearer-two-tokens", [(A, b"Bearer " + GOOD + b" " + GOOD)], b""),
    ("bearer-comma-list", [(A, b"Bearer " + GOOD + b", Bearer x")], b""),
    ("two-authorization-same", [(A, b"Bearer " + GOOD), (A, b"Bearer " + GOOD)], b""),
    ("two-authorization-differ", [(A, b"Bearer " + GOOD), (A, b"Bearer sk-wrong-0123456789abcdef")], b""),
    ("two-authorization-wrong-first", [(A, b"Bearer sk-wrong-0123456789abcdef"), (A, b"Bearer " + GOOD)], b""),
    ("two-x-api-key", [(X, GOOD), (X, GOOD)], b""),
    ("two-x-api-key-differ", [(X, b"sk-wrong-0123456789abcdef"), (X, GOOD)], b""),
    ("conflicting-headers", [(A, b"Bearer " + GOOD), (X, b"sk-wrong-0123456789abcdef")], b""),
    ("conflicting-headers-reversed", [(A, b"Bearer sk-wrong-0123456789abcdef"), (X, GOOD)], b""),
    ("good-bearer-bad-scheme-x", [(A, b"Basic " + GOOD), (X, GOOD)], b""),
    ("x-api-key-empty", [(X, b"")], b""),
    ("x-api-key-wrong", [(X, b"sk-wrong-0123456789abcdef")], b""),
    ("x-api-key-bearer-prefixed", [(X, b"Bearer " + GOOD)], b""),
    ("query-api-key", [], b"api_key=" + GOOD),
    ("query-key", [], b"key=" + GOOD),
    ("query-authorization", [], b"authorization=Bearer%20" + GOOD),
    ("query-x-api-key", [], b"x-api-key=" + GOOD),
    ("100kb-bearer", [(A, b"Bearer " + b"k" * 100_000)], b""),
    ("100kb-x-api-key", [(X, b"k" * 100_000)], b""),
    ("513-chars", [(A, b"Bearer " + b"k" * 513)], b""),
    ("key-then-100kb", [(A, b"Bearer " + GOOD + b"k" * 100_000)], b""),
    ("nul-in-key", [(A, b"Bearer " + GOOD + b"\x00")], b""),
    ("nul-before-key", [(A, b"Bearer \x00" + GOOD)], b""),
    ("cr-in-key", [(A, b"Bearer " + GOOD[:5] + b"\r" + GOOD[5:])], b""),
    ("lf-in-key", [(A, b"Bearer " + GOOD[:5] + b"\n" + GOOD[5:])], b""),
    ("crlf-injection", [(A, b"Bearer " + GOOD + b"\r\nx-admin: 1")], b""),
    ("tab-in-key", [(A, b"Bearer " + GOOD[:5] + b"\t" + GOOD[5:])], b""),
    ("del-in-key", [(A, b"Bearer " + GOOD + b"\x7f")], b""),
    ("latin1-in-key", [(A, b"Bearer " + GOOD + b"\xe9")], b""),
    ("utf8-in-key", [(A, b"Bearer " + GOOD + "é".encode())], b""),
    ("nul-x-api-key", [(X, GOOD + b"\x00")], b""),
    ("space-inside-key", [(A, b"Bearer " + GOOD[:5] + b" " + GOOD[5:])], b""),
    ("percent-encoded-key", [(A, b"Bearer sk%2Dgood%2D0123456789abcdef")], b""),
    ("base64-key", [(A, b"Bearer c2stZ29vZC0wMTIzNDU2Nzg5YWJjZGVm")], b""),
    ("sha256-of-key", [(A, b"Bearer 7d5a0b5bd47b7f9f0c8e5b3c9b3e8ad2d0e4c0f1a2b3c4d5e6f708192a3b4c5d")], b""),
    ("key-name-as-key", [(A, b"Bearer good")], b""),
    ("env-name-as-key", [(A, b"Bearer GOOD")], b""),
    ("upstream-key", [(A, b"Bearer sk-upstream")], b""),
    ("proxy-authorization", [(b"proxy-authorization", b"Bearer " + GOOD)], b""),
    ("cookie", [(b"cookie", b"api_key=" + GOOD)], b""),
    ("x-d3-admin-token", [(b"x-d3-admin-token", GOOD)], b""),
    ("api-key-header", [(b"api-key", GOOD)], b""),
    ("x-goog-api-key", [(b"x-goog-api-key", GOOD)], b""),
    ("x-forwarded-user", [(b"x-forwarded-user", b"good")], b""),
    ("uppercase-header-name", [(b"Authorization", b"Bearer " + GOOD)], b""),  # ASGI names are lower case
]


@pytest.fixture
async def faces(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, FakeEngine, list[str], Any]]:
    config = parse_config(CONFIG, "c.yaml")
    engine = FakeEngine({"j": 0.1})
    seen: list[str] = []

    async def app_answer(request: Any) -> JSONResponse:
        seen.append(request.url.path)
        return JSONResponse({"app": True})

    inner = Starlette(routes=[Route(p, app_answer, methods=["POST"]) for p in
                              ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions")])  # fmt: skip
    monkeypatch.setenv("GOOD", KEY)  # the middleware reads its keys from the process's environment
    behind = D3RouterMiddleware(inner, config=config, engine=engine)
    with respx.mock(assert_all_called=False) as mock:
        upstream = mock.route().mock(return_value=httpx.Response(200, json={"up": True}))
        proxy = create_app(config, engine=engine, transport=httpx.AsyncHTTPTransport(), environ=ENVIRON)
        async with (
            proxy,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://proxy") as to_proxy,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=behind), base_url="http://app") as to_app,
        ):  # fmt: skip
            yield to_proxy, to_app, engine, seen, upstream


async def raw_call(app: Any, method: str, path: str, headers: Headers, query: bytes) -> tuple[int, bytes]:
    """The request as the headers are, bytes and all (a client library would refuse some of them)."""
    body = json.dumps({"model": "auto", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                       "prompt": "hi", "input": "hi"}).encode()  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": query,
             "headers": [(b"content-type", b"application/json"), *headers], "http_version": "1.1"}  # fmt: skip
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions", "/v1/models", "/v1/embeddings"]


@pytest.mark.parametrize(("headers", "query"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_every_authentication_attack_is_refused_before_anything(
    faces: tuple[httpx.AsyncClient, httpx.AsyncClient, FakeEngine, list[str], Any], headers: Headers, query: bytes
) -> None:
    to_proxy, to_app, engine, seen, upstream = faces
    proxy, behind = to_proxy._transport.app, to_app._transport.app  # type: ignore[attr-defined]
    for path in PATHS:
        method = "GET" if path == "/v1/models" else "POST"
        status, body = await raw_call(proxy, method, path, headers, query)
        assert status in (400, 401), (path, status)
        assert GOOD not in body and b"k" * 100 not in body  # never echoed
        if path != "/v1/models" and path != "/v1/embeddings":
            app_status, app_body = await raw_call(behind, method, path, headers, query)
            assert app_status == status and json.loads(app_body) == json.loads(body)  # the same answer, both faces
    assert not upstream.called and engine.calls == [] and seen == []


def test_the_corpus_is_fifty_attacks_and_more() -> None:
    assert len(CASES) >= 50 and len({case[0] for case in CASES}) == len(CASES)


async def test_the_good_key_passes_both_faces(
    faces: tuple[httpx.AsyncClient, httpx.AsyncClient, FakeEngine, list[str], Any],
) -> None:
    to_proxy, to_app, _, seen, upstream = faces
    proxy, behind = to_proxy._transport.app, to_app._transport.app  # type: ignore[attr-defined]
    for headers in ([(A, b"Bearer " + GOOD)], [(A, b"bearer  " + GOOD + b" ")], [(X, GOOD)],
                    [(A, b"Bearer " + GOOD), (X, GOOD)]):  # fmt: skip
        assert (await raw_call(proxy, "POST", "/v1/chat/completions", headers, b""))[0] == 200
        assert (await raw_call(behind, "POST", "/v1/chat/completions", headers, b""))[0] == 200
    assert upstream.called and len(seen) == 4
