"""Overlap in the middleware (issue 31), a real Starlette app behind `D3RouterMiddleware` under uvicorn, over raw
sockets: the app's handler starts while the engine decides; a block never leaks a byte of its answer, streamed or
not, and cancels the handler at once; an agreeing decision releases the answer; a decision that changes what the app
would get calls it again; a client that leaves cancels both; a streamed answer is held within a bound."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from policies import parse_config
from router import D3RouterMiddleware
from router._faces import overlapped
from tests.router._overlap_peers import MARK, WAIT_S, header_of, raw_post, status_of
from tests.router.test_overlap import Timed, body, wait_for
from tests.router.test_sockets import Served

DECISION_S = 0.6  # the app answers in 0.02 s: long before the decision is in (a margin for a loaded machine)
CHUNK = 64 * 1024
CHUNKS = 128  # an endless stream's chunks: 8 MiB, eight times what is held before the decision
PATH = "/v1/chat/completions"


@dataclass
class Call:
    """One call of the app's handler."""

    text: str
    rule: str
    pending: bool  # it saw the expected decision at request.state.d3, not yet the engine's
    at: float
    route: tuple[str, ...]
    cancelled_at: float | None = None
    finished: bool = False


@dataclass
class Handler:
    calls: list[Call] = field(default_factory=list)
    produced = 0  # bytes an endless stream has yielded

    async def endpoint(self, request: Request) -> Response:
        sent = await request.json()
        d3 = request.state.d3
        text = sent["messages"][0]["content"]
        route = tuple(getattr(d3.decision.action, "upstreams", ()))
        call = Call(text, d3.decision.rule, d3.overlap.get("outcome") == "pending", time.monotonic(), route)
        self.calls.append(call)
        try:
            await asyncio.sleep(5.0 if "slow" in text else 0.02)
        except asyncio.CancelledError:
            call.cancelled_at = time.monotonic()
            raise
        if sent.get("stream"):
            return StreamingResponse(self._stream(request, call), media_type="text/event-stream")
        call.finished = True
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        return JSONResponse({"content": MARK, "rule": call.rule, "call": len(self.calls), "usage": usage})

    async def _stream(self, request: Request, call: Call) -> AsyncIterator[bytes]:
        try:
            if "endless" in call.text:
                for _ in range(CHUNKS):
                    self.produced += CHUNK
                    yield b"data: " + b"x" * (CHUNK - 8) + b"\n\n"
            for index in range(3):
                yield f"data: {MARK} {index}\n\n".encode()
                await asyncio.sleep(0.01)
            # After the decision: request.state.d3 is the engine's now.
            yield f"data: {request.state.d3.overlap.get('outcome')}\n\n".encode()
            call.finished = True
        except asyncio.CancelledError:
            call.cancelled_at = time.monotonic()
            raise


def config(extra: str = "", overlap: str = "{when: always}", session: str = "off", guard: str = "") -> str:
    return f"""
server: {{expose_decisions: true{extra}}}
upstreams: {{a: {{url: "http://127.0.0.1:1/v1"}}, b: {{url: "http://127.0.0.1:2/v1"}}}}
policies:
  auto:
    overlap: {overlap}
    session: {{mode: {session}}}
    questions:
      j: {{type: noul}}
      k: {{type: choice, criteria: {{small: small, big: big, hot: hot, tagged: tagged}}}}
    rules:
      - {{name: guard, when: j > 0.5, block: {{status: 403, message: refused by policy}}}}
      - {{name: big, when: 'k == "big"', route: b}}
      - {{name: hot, when: 'k == "hot"', route: a, set: {{temperature: 0.5}}}}
      - {{name: tagged, when: 'k == "tagged"', route: a, tag: {{x-team: blue}}}}
      - {{name: default, route: a}}
{guard}"""


def served(engine: Timed, handler: Handler, text: str | None = None) -> tuple[Served, D3RouterMiddleware]:
    app = Starlette(routes=[Route(PATH, handler.endpoint, methods=["POST"])])
    middleware = D3RouterMiddleware(app, config=parse_config(text or config()), engine=engine)
    return Served(middleware), middleware


def post(port: int, text: str, stream: bool = False) -> bytes:
    return raw_post(port, PATH, body("chat", text, stream))


def payload(raw: bytes) -> bytes:
    return raw.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_block_never_leaks_a_byte_of_the_apps_answer(stream: bool) -> None:
    engine, handler = Timed(DECISION_S), Handler()
    proxy, _ = served(engine, handler)
    with proxy:
        raw = post(proxy.port, "forbidden", stream)
    assert status_of(raw) == 403
    assert MARK.encode() not in raw and b"refused by policy" in raw
    (call,) = handler.calls
    assert call.pending and call.at < engine.done_at[0]  # started before the decision, answered before it too
    assert call.finished if not stream else call.cancelled_at is not None or call.finished


def test_the_apps_handler_is_cancelled_at_once_on_a_block() -> None:
    engine, handler = Timed(DECISION_S), Handler()
    proxy, _ = served(engine, handler)
    with proxy:
        started = time.monotonic()
        raw = post(proxy.port, "forbidden slow")
        took = time.monotonic() - started
    assert status_of(raw) == 403 and took < 4.0  # the handler takes 5 s; the decision 0.6 s, with a margin
    (call,) = handler.calls
    assert call.cancelled_at is not None and call.cancelled_at - engine.done_at[0] < 3.0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_agreeing_decision_releases_the_apps_answer(stream: bool) -> None:
    engine, handler = Timed(DECISION_S), Handler()
    proxy, _ = served(engine, handler)
    with proxy:
        raw = post(proxy.port, "hello", stream)
    assert status_of(raw) == 200 and MARK.encode() in raw
    assert header_of(raw, "x-d3-speculative") == "used" and header_of(raw, "x-d3-rule") == "default"
    (call,) = handler.calls
    assert call.pending and call.at < engine.done_at[0]
    if stream:  # a short stream had come whole before the decision
        assert payload(raw).count(MARK.encode()) == 3
    else:
        assert json.loads(payload(raw))["call"] == 1


@pytest.mark.parametrize(("text", "rule", "outcome"), [("warm", "hot", "changed"), ("label", "tagged", "changed"),
                                                       ("elsewhere", "big", "rerouted")])  # fmt: skip
def test_a_decision_that_changes_what_the_app_gets_calls_it_again(text: str, rule: str, outcome: str) -> None:
    engine, handler = Timed(DECISION_S), Handler()
    proxy, _ = served(engine, handler)
    with proxy:
        raw = post(proxy.port, text)
    assert status_of(raw) == 200 and header_of(raw, "x-d3-speculative") == outcome
    speculated, decided = handler.calls
    assert (speculated.rule, speculated.pending) == ("default", True)
    assert (decided.rule, decided.pending) == (rule, False) and decided.at > engine.done_at[0]
    assert json.loads(payload(raw)) | {"usage": None} == {"content": MARK, "rule": rule, "call": 2, "usage": None}


def test_a_client_that_leaves_cancels_the_decision_and_the_apps_handler() -> None:
    engine, handler = Timed(5.0), Handler()
    proxy, middleware = served(engine, handler)
    with proxy:
        data = json.dumps(body("chat", "slow", False)).encode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as conn:
            conn.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (PATH.encode(), len(data), data))  # fmt: skip
            assert wait_for(lambda: bool(handler.calls)), "the app's handler never started"
        left = time.monotonic()
        assert wait_for(lambda: handler.calls[0].cancelled_at is not None), "the handler outlived the client"
        assert wait_for(lambda: engine.cancelled == 1), "the decision went on after the client left"
    cancelled_at = handler.calls[0].cancelled_at
    assert cancelled_at is not None and cancelled_at - left < 3.5 and not engine.done_at
    metrics = middleware.service.metrics.render()
    assert 'd3router_speculations_total{outcome="abandoned",policy="auto"} 1.0' in metrics


@pytest.mark.parametrize("blocked", [False, True], ids=["agreeing", "blocked"])
def test_a_streamed_answer_is_held_within_a_bound(blocked: bool) -> None:
    engine, handler = Timed(1.0), Handler()
    proxy, _ = served(engine, handler)
    with proxy:
        started = time.monotonic()
        raw = post(proxy.port, "forbidden endless" if blocked else "endless", stream=True)
    held = handler.produced if blocked else None
    assert time.monotonic() - started >= 1.0
    # Held before the decision: the bound, plus the message that passed it and the one waiting to be kept.
    if blocked:
        assert status_of(raw) == 403 and MARK.encode() not in raw and b"xxxx" not in raw
        assert held is not None and held <= overlapped.HOLD_LIMIT + 2 * CHUNK, held
        time.sleep(0.2)
        assert handler.produced == held and not handler.calls[0].finished  # cancelled: not read on
    else:  # released: all of it, as it comes; the app read the engine's decision once it was in
        assert status_of(raw) == 200 and payload(raw).count(b"x" * (CHUNK - 8)) == CHUNKS
        assert b"data: used\n\n" in payload(raw) and handler.calls[0].finished


def test_a_held_stream_stops_being_read_until_the_decision() -> None:
    engine, handler = Timed(1.0), Handler()
    proxy, _ = served(engine, handler)
    with proxy:
        seen: list[int] = []

        def watch() -> None:
            time.sleep(0.7)  # the decision takes 1 s: by now the app has filled what is held
            seen.append(handler.produced)

        watcher = threading.Thread(target=watch)
        watcher.start()
        raw = post(proxy.port, "endless", stream=True)
        watcher.join()
    assert status_of(raw) == 200
    assert seen and seen[0] <= overlapped.HOLD_LIMIT + 2 * CHUNK < CHUNKS * CHUNK, seen


def test_metrics_and_the_decision_log_count_the_outcomes_and_the_wasted_tokens(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    engine, handler = Timed(DECISION_S), Handler()
    proxy, middleware = served(engine, handler, config(f', decision_log: {{path: "{log}"}}'))
    with proxy:
        for text in ("hello", "forbidden", "elsewhere"):
            post(proxy.port, text)
    metrics = middleware.service.metrics.render()
    assert 'd3router_speculations_started_total{policy="auto"} 3.0' in metrics
    for outcome in ("used", "blocked", "rerouted"):
        assert f'd3router_speculations_total{{outcome="{outcome}",policy="auto"}} 1.0' in metrics
    # The blocked and the rerouted answers had come whole (0.02 s) before the decision (0.6 s): their usage counts.
    assert 'd3router_speculation_wasted_tokens_total{kind="input",policy="auto"} 22.0' in metrics
    assert 'd3router_speculation_wasted_tokens_total{kind="output",policy="auto"} 14.0' in metrics
    assert wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == 3)
    used, blocked, rerouted = (json.loads(line)["overlap"] for line in log.read_text().splitlines())
    assert used == {"outcome": "used", "upstream": "a"}
    assert blocked == {"outcome": "blocked", "upstream": "a", "wasted_tokens": {"input": 11, "output": 7}}
    assert rerouted == {"outcome": "rerouted", "upstream": "a", "wasted_tokens": {"input": 11, "output": 7}}


def test_sticky_without_a_session_never_starts_the_app_early() -> None:
    engine, handler = Timed(DECISION_S), Handler()
    text = config(overlap="{when: sticky}", session="sticky")
    proxy, middleware = served(engine, handler, text)
    with proxy:
        raw = post(proxy.port, "hello")
    assert status_of(raw) == 200 and header_of(raw, "x-d3-speculative") == "none"
    (call,) = handler.calls
    assert not call.pending and call.at > engine.done_at[0]
    assert "d3router_speculations_started_total" not in middleware.service.metrics.render()


def test_sticky_speculates_on_the_sessions_route() -> None:
    engine, handler = Timed(DECISION_S), Handler()
    proxy, _ = served(engine, handler, config(overlap="{when: sticky}", session="sticky"))
    with proxy:
        session = {"x-session-id": "s1"}
        first = raw_post(proxy.port, PATH, body("chat", "elsewhere", False), session)  # routed to b: stored
        later = raw_post(proxy.port, PATH, body("chat", "hello", False), session)  # sticky on b
        blocked = raw_post(proxy.port, PATH, body("chat", "forbidden", False), session)
    assert header_of(first, "x-d3-speculative") == "none" and header_of(later, "x-d3-speculative") == "used"
    assert header_of(later, "x-d3-session") == "sticky"
    assert status_of(blocked) == 403 and MARK.encode() not in blocked  # the session never replaces a guard
    assert [(call.route, call.pending) for call in handler.calls] == [(("b",), False), (("b",), True), (("b",), True)]
    assert handler.calls[1].at < engine.done_at[1]


def test_an_answer_guard_judges_the_released_answer() -> None:
    engine, handler = Timed(DECISION_S), Handler()
    guard = """    answer:
      questions: {leak: {type: noul}}
      rules: [{name: no-leak, when: leak > 0.5, block: {status: 451, message: withheld}}]
"""
    engine.answers = lambda state, questions: {"leak": 0.9} if "leak" in questions else Timed.table(state, questions)
    proxy, _ = served(engine, handler, config(guard=guard))
    with proxy:
        raw = post(proxy.port, "hello")
    assert status_of(raw) == 451 and MARK.encode() not in raw
    assert header_of(raw, "x-d3-speculative") == "used" and len(handler.calls) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_fastapi_with_add_middleware_holds_and_releases(stream: bool) -> None:
    fastapi = pytest.importorskip("fastapi", reason="FastAPI comes with the test extra")
    engine, handler = Timed(DECISION_S), Handler()
    app = fastapi.FastAPI()
    app.add_middleware(D3RouterMiddleware, config=parse_config(config()), engine=engine)
    app.post(PATH)(handler.endpoint)
    with Served(app) as proxy:
        blocked, used = post(proxy.port, "forbidden", stream), post(proxy.port, "hello", stream)
    assert status_of(blocked) == 403 and MARK.encode() not in blocked
    assert status_of(used) == 200 and MARK.encode() in used and header_of(used, "x-d3-speculative") == "used"
    assert [call.pending for call in handler.calls] == [True, True]
