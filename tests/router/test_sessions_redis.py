"""Sessions in a real Redis (issue 12): each test starts its own `redis-server` on a free port and stops it by its
PID. Shared across app instances and across two `d3router serve` processes; Redis slow, killed and restarted: no
request fails, the in-process store answers meanwhile (counted, logged once), and stickiness resumes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from d3backend import FakeEngine, free_port
from policies import parse_config
from router import ProxyApp, create_app
from router._sessions.store import RedisStore
from tests.router._peers import start, stop
from tests.router._redis import RedisServer  # the redis_server fixture is in tests/router/conftest.py

pytestmark = pytest.mark.anyio

CONFIG = """
server:
  redis: {redis}
  redis_timeout_s: {timeout}
  sessions: {{salt_env: D3_SESSION_SALT}}
upstreams:
  small: {{url: http://small.test/v1, tier: 1}}
  large: {{url: http://large.test/v1, tier: 2}}
policies:
  auto:
    questions: {{hard: {{type: noul}}}}
    rules:
      - {{name: hard, when: hard > 0.5, route: large}}
      - {{name: default, route: small}}
"""
ENV = {"D3_SESSION_SALT": "test-salt"}


def answers(state: Any, questions: Any) -> dict[str, Any]:
    return {"hard": 0.9 if "HARD" in json.dumps(state) else 0.1}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        for name in ("small", "large"):
            router.post(f"http://{name}.test/v1/chat/completions").mock(
                return_value=httpx.Response(200, json={"up": name})
            )
        yield router


async def proxy(url: str, timeout: float = 0.05) -> ProxyApp:
    config = parse_config(CONFIG.format(redis=url, timeout=timeout), "c.yaml")
    return create_app(config, engine=FakeEngine(answers), transport=httpx.AsyncHTTPTransport(), environ=ENV)


@pytest.fixture
async def pair(redis_server: RedisServer, mock: respx.MockRouter) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Two routers in this process sharing one Redis, as two replicas would."""
    apps = [await proxy(redis_server.url), await proxy(redis_server.url)]
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") for app in apps]
    yield clients
    for client, app in zip(clients, apps, strict=True):
        await client.aclose()
        await app.aclose()


def chat(history: list[str]) -> dict[str, Any]:
    messages = []
    for index, text in enumerate(history):
        messages.append({"role": "user", "content": text})
        if index < len(history) - 1:
            messages.append({"role": "assistant", "content": f"answer {index}"})
    return {"model": "auto", "messages": messages}


def seen(response: httpx.Response) -> tuple[int, str | None, str | None]:
    # The upstream from its own answer: x-d3-upstream is a debug header, closed by default (issue 25.4);
    # x-d3-session is in the default view.
    upstream = response.json().get("up") if response.status_code == 200 else None
    return response.status_code, upstream, response.headers.get("x-d3-session")


async def test_replicas_share_sessions_through_redis(pair: list[httpx.AsyncClient], redis_server: RedisServer) -> None:
    history = ["a HARD one"]
    assert seen(await pair[0].post("/v1/chat/completions", json=chat(history))) == (200, "large", "new")
    for turn in range(1, 8):
        history.append("easy")
        response = await pair[turn % 2].post("/v1/chat/completions", json=chat(history))
        assert seen(response) == (200, "large", "sticky"), turn
    with redis_server.client() as client:
        keys = client.keys("*")
        assert len(keys) == 1 and keys[0].startswith("d3:session:auto:")
        assert client.get(keys[0]) == "large"  # an upstream's name: no prompt, no id
        assert 0 < client.pttl(keys[0]) <= 3600 * 1000


async def test_redis_killed_and_restarted_no_request_fails(
    pair: list[httpx.AsyncClient], redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="router._sessions.store")
    history = ["HARD first"]
    assert seen(await pair[0].post("/v1/chat/completions", json=chat(history))) == (200, "large", "new")
    redis_server.stop()
    for turn in range(1, 13):
        history.append("easy")
        response = await pair[turn % 2].post("/v1/chat/completions", json=chat(history))
        assert response.status_code == 200, turn
    # Replica 0 remembers the session in-process: its turns stay sticky while Redis is away.
    history.append("easy")
    assert seen(await pair[0].post("/v1/chat/completions", json=chat(history))) == (200, "large", "sticky")
    down = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(down) == 2  # one line per replica, not one per request
    metrics = (await pair[0].get("/metrics")).text
    assert 'd3router_redis_errors_total{op="get"}' in metrics
    assert 'd3router_redis_fallbacks_total{op="get"}' in metrics
    # Back, empty (no persistence): each replica returns to Redis by itself, and the session is written back.
    restarted = RedisServer(redis_server.port).start()
    try:
        await shared_again(lambda replica, body: pair[replica].post("/v1/chat/completions", json=body))
        history.append("easy")
        assert seen(await pair[0].post("/v1/chat/completions", json=chat(history))) == (200, "large", "sticky")
        for turn in range(4):
            history.append("easy")
            response = await pair[turn % 2].post("/v1/chat/completions", json=chat(history))
            assert seen(response) == (200, "large", "sticky"), turn
        fresh = ["brand new HARD"]
        assert seen(await pair[1].post("/v1/chat/completions", json=chat(fresh))) == (200, "large", "new")
        fresh.append("easy")
        assert seen(await pair[0].post("/v1/chat/completions", json=chat(fresh))) == (200, "large", "sticky")
        assert any("answers again" in r.getMessage() for r in caplog.records)
    finally:
        restarted.stop()


async def shared_again(post: Any) -> None:
    """Wait until both replicas use Redis again (each retries it on its own, RETRY_S after its last failure): a
    probe conversation opened on one is sticky on the other."""
    deadline = time.monotonic() + 30
    for attempt in range(10_000):
        probe = [f"probe {attempt} HARD"]
        await _maybe(post(0, chat(probe)))
        probe.append("easy")
        if seen(await _maybe(post(1, chat(probe))))[2] == "sticky":
            return
        if time.monotonic() > deadline:
            pytest.fail("the replicas did not return to Redis within 30 s")
        await asyncio.sleep(0.1)


async def _maybe(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


async def test_a_slow_redis_costs_at_most_its_timeout(mock: respx.MockRouter) -> None:
    """A Redis that accepts connections and never answers: every request is served, through the fallback."""
    hung: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)
        await reader.read(65536)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    app = await proxy(f"redis://127.0.0.1:{port}/0", timeout=0.05)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
            history = ["HARD"]
            assert seen(await client.post("/v1/chat/completions", json=chat(history))) == (200, "large", "new")
            for _ in range(5):
                history.append("easy")
                assert seen(await client.post("/v1/chat/completions", json=chat(history))) == (200, "large", "sticky")
            metrics = (await client.get("/metrics")).text
        assert isinstance(app.sessions.store, RedisStore)
        lines = [line for line in metrics.splitlines() if line.startswith("d3router_redis_")]
        # The opening's write timed out once; then Redis is left alone for RETRY_S: no request waits again.
        assert sorted(lines) == [
            "d3router_redis_down 1.0",
            'd3router_redis_errors_total{op="set"} 1.0',
            'd3router_redis_fallbacks_total{op="get"} 5.0',
            'd3router_redis_fallbacks_total{op="set"} 1.0',
        ]
    finally:
        await app.aclose()
        for writer in hung:
            writer.close()
        server.close()


# --- two `d3router serve` processes -------------------------------------------------------------------------------
PEER = textwrap.dedent('''
    """The decision engine (`/v1/systemone`: `hard` is yes for a state with HARD) and two upstreams, one process."""
    import itertools, json, sys
    import uvicorn

    ANSWERS = itertools.count(1)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        if path == "/v1/models":
            out = {"object": "list", "data": [{"id": "d3-tiny", "object": "model"}]}
        elif path == "/v1/systemone":
            request = json.loads(body)
            p = 0.9 if "HARD" in json.dumps(request["state"]) else 0.1
            noul = {"type": "noul", "noul": p, "probabilities": {"yes": p, "no": 1 - p}, "confidence": 0.9}
            out = {"id": "d", "object": "structured_decision", "created": 0, "model": "d3-tiny",
                   "answers": {qid: noul for qid in request["questions"]},
                   "usage": {"input_tokens": 1, "output_tokens": 0}, "joint": None}
        else:
            out = {"up": path.split("/")[1], "id": f"resp_{next(ANSWERS)}"}  # an id: a Responses answer's
        data = json.dumps(out).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
''')

SERVE = """
server: {{redis: "{redis}", sessions: {{salt_env: D3_SESSION_SALT}}}}
engine: {{remote: {{urls: ["http://127.0.0.1:{peer}"], model: d3-tiny}}, cache: {{max_entries: 0}}}}
upstreams:
  small: {{url: "http://127.0.0.1:{peer}/small/v1"}}
  large: {{url: "http://127.0.0.1:{peer}/large/v1"}}
policies:
  auto:
    questions: {{hard: {{type: noul}}}}
    rules:
      - {{name: hard, when: hard > 0.5, route: large}}
      - {{name: default, route: small}}
"""


def test_two_serve_processes_share_one_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    peer_port, ports = free_port(), [free_port(), free_port()]
    (tmp_path / "peer.py").write_text(PEER, encoding="utf-8")
    config = tmp_path / "router.yaml"
    config.write_text(SERVE.format(redis=redis_server.url, peer=peer_port), encoding="utf-8")
    processes = [start([str(tmp_path / "peer.py"), str(peer_port)], f"http://127.0.0.1:{peer_port}/v1/models", ENV)]
    restarted: RedisServer | None = None
    try:
        for port in ports:
            argv = ["-m", "router", "serve", str(config), "--port", str(port), "--log-level", "warning"]
            processes.append(start(argv, f"http://127.0.0.1:{port}/healthz", ENV))
        urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports]
        with httpx.Client(timeout=10) as http:

            def turn(history: list[str], replica: int) -> tuple[int, str | None, str | None]:
                response = http.post(urls[replica], json=chat(history))
                return response.status_code, response.json().get("up"), response.headers.get("x-d3-session")

            history = ["a HARD task"]
            assert turn(history, 0) == (200, "large", "new")
            for index in range(1, 7):
                history.append("easy")
                assert turn(history, index % 2) == (200, "large", "sticky"), index
            redis_server.stop()  # mid-run: zero failed requests
            failures = 0
            for index in range(8):
                history.append("easy")
                failures += turn(history, index % 2)[0] != 200
            assert failures == 0
            restarted = RedisServer(redis_server.port).start()

            def post(replica: int, body: dict[str, Any]) -> httpx.Response:
                return http.post(urls[replica], json=body)

            asyncio.run(shared_again(post))
            fresh = ["another HARD task"]
            assert turn(fresh, 1) == (200, "large", "new")
            for index in range(6):
                fresh.append("easy")
                assert turn(fresh, index % 2) == (200, "large", "sticky"), index
    finally:
        if restarted is not None:
            restarted.stop()
        for process in processes:
            stop(process)


def test_redis_server_stops_by_its_pid() -> None:
    server = RedisServer().start()
    assert server.process is not None
    pid = server.process.pid
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_responses_chain_crosses_replicas(tmp_path: Path, redis_server: RedisServer) -> None:
    """Each answer's id is in Redis when the client has the answer: its next turn, sent to the other replica through
    a real socket, continues the session (tests/router/test_sessions.py checks the order itself)."""
    peer_port, ports = free_port(), [free_port(), free_port()]
    (tmp_path / "peer.py").write_text(PEER, encoding="utf-8")
    config = tmp_path / "router.yaml"
    config.write_text(SERVE.format(redis=redis_server.url, peer=peer_port), encoding="utf-8")
    processes = [start([str(tmp_path / "peer.py"), str(peer_port)], f"http://127.0.0.1:{peer_port}/v1/models", ENV)]
    try:
        for port in ports:
            argv = ["-m", "router", "serve", str(config), "--port", str(port), "--log-level", "warning"]
            processes.append(start(argv, f"http://127.0.0.1:{port}/healthz", ENV))
        with httpx.Client(timeout=10) as http:
            previous = None
            for turn in range(6):
                body = {"model": "auto", "input": "a HARD task" if turn == 0 else "easy"}
                if previous is not None:
                    body["previous_response_id"] = previous
                response = http.post(f"http://127.0.0.1:{ports[turn % 2]}/v1/responses", json=body)
                seen = (response.status_code, response.json()["up"], response.headers.get("x-d3-session"))
                assert seen == (200, "large", "new" if turn == 0 else "sticky"), turn
                previous = response.json()["id"]
    finally:
        for process in processes:
            stop(process)
