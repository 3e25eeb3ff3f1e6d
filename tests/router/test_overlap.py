"""Overlap (issue 31.3), over real sockets: the upstream request starts while the engine decides; a block never
leaks a byte of it to the client, streamed or not, on every API; a cancelled one's connection is closed at once; a
client that leaves cancels the decision and the upstream request; sessions, tags, `set` and answer guards behave
as without overlap."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

from d3backend import Decided, FakeEngine, JSONValue, Question
from policies import parse_config
from router import create_app
from tests.router._overlap_peers import MARK, WAIT_S, RecordingUpstream, header_of, raw_post, status_of
from tests.router.test_sockets import Served

DECISION_S = 0.3  # the engine's time: the upstream (0.05 s) has answered long before the decision is in
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}  # fmt: skip


def body(api: str, text: str, stream: bool, **extra: Any) -> dict[str, Any]:
    if api == "completions":
        return {"model": "auto", "prompt": text, "stream": stream, **extra}
    if api == "responses":
        return {"model": "auto", "input": text, "stream": stream, **extra}
    sent = {"model": "auto", "messages": [{"role": "user", "content": text}], "stream": stream, **extra}
    return {**sent, "max_tokens": 16} if api == "messages" else sent


class Timed(FakeEngine):
    """The fake engine, noting when each decision ended and whether one was cancelled."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(self.table, delay_s=delay_s)
        self.done_at: list[float] = []
        self.cancelled = 0

    @staticmethod
    def table(state: JSONValue, questions: Mapping[str, Question]) -> dict[str, Any]:
        text = json.dumps(state)
        kind = "big" if "elsewhere" in text else "hot" if "warm" in text else "tagged" if "label" in text else "small"
        return {"j": 0.99 if "forbidden" in text else 0.01, "k": kind}

    async def decide(self, state: JSONValue, questions: Mapping[str, Question], **kwargs: Any) -> Decided:
        try:
            decided = await super().decide(state, questions, **kwargs)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if "ready" not in questions:  # not the readiness probe's
            self.done_at.append(time.monotonic())
        return decided


def config_text(upstream: RecordingUpstream, overlap: str = "{when: always}", session: str = "off",
                extra: str = "", expose: bool = True) -> str:  # fmt: skip
    return f"""
server: {{expose_decisions: {str(expose).lower()}}}
upstreams: {{a: {{url: "{upstream.url("a")}"}}, b: {{url: "{upstream.url("b")}"}}}}
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
{extra}"""


@pytest.fixture
def upstream() -> Iterator[RecordingUpstream]:
    peer = RecordingUpstream()
    try:
        yield peer
    finally:
        peer.close()


def served(upstream: RecordingUpstream, engine: Timed, **kwargs: Any) -> Served:
    return Served(create_app(parse_config(config_text(upstream, **kwargs)), engine=engine))


def wait_for(check: Any, wait_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + wait_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", list(PATHS))
def test_a_block_never_leaks_a_byte_of_the_speculative_answer(upstream: RecordingUpstream, api: str,
                                                              stream: bool) -> None:  # fmt: skip
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        raw = raw_post(proxy.port, PATHS[api], body(api, "something forbidden", stream))
    # The upstream had answered (0.05 s) long before the block (0.3 s): its answer waited, and was dropped.
    assert len(upstream.seen) == 1 and upstream.seen[0].path.startswith("/a/v1/")
    assert upstream.seen[0].at < engine.done_at[0]
    assert status_of(raw) == 403
    assert MARK.encode() not in raw
    assert b"refused by policy" in raw
    assert header_of(raw, "x-d3-speculative") == "blocked"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", list(PATHS))
def test_an_agreeing_decision_releases_the_speculative_answer(upstream: RecordingUpstream, api: str,
                                                              stream: bool) -> None:  # fmt: skip
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        raw = raw_post(proxy.port, PATHS[api], body(api, "hello", stream))
    assert status_of(raw) == 200
    assert MARK.encode() in raw
    assert header_of(raw, "x-d3-speculative") == "used"
    # One upstream request, started before the decision was in.
    assert len(upstream.seen) == 1 and upstream.seen[0].answered
    assert upstream.seen[0].at < engine.done_at[0]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_block_closes_the_upstream_connection_at_once(upstream: RecordingUpstream, stream: bool) -> None:
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        started = time.monotonic()
        raw = raw_post(proxy.port, PATHS["chat"], body("chat", "slow and forbidden", stream))
        answered = time.monotonic()
        assert wait_for(lambda: upstream.seen and upstream.seen[0].closed_at is not None), "still open after the block"
    assert status_of(raw) == 403
    seen = upstream.seen[0]
    assert seen.closed_at is not None and not seen.answered
    # Closed with the block (the upstream would have answered after 5 s), not when the client's answer ended.
    assert seen.closed_at - started < 3.5
    assert seen.closed_at <= answered + 0.5


def test_another_route_cancels_the_speculation_and_sends_the_request_where_it_belongs(
    upstream: RecordingUpstream,
) -> None:
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        raw = raw_post(proxy.port, PATHS["chat"], body("chat", "slow, elsewhere", False))
    assert status_of(raw) == 200
    assert header_of(raw, "x-d3-speculative") == "rerouted"
    assert header_of(raw, "x-d3-upstream") == "b"
    speculative, decided = upstream.seen
    assert speculative.path.startswith("/a/") and speculative.closed_at is not None and not speculative.answered
    assert decided.path.startswith("/b/") and decided.answered
    assert decided.at >= engine.done_at[0]


def test_a_set_the_speculation_could_not_know_resends_the_request_with_it(upstream: RecordingUpstream) -> None:
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        raw = raw_post(proxy.port, PATHS["chat"], body("chat", "slow but warm", False))
    assert status_of(raw) == 200 and header_of(raw, "x-d3-speculative") == "changed"
    speculative, decided = upstream.seen
    assert "temperature" not in speculative.body and speculative.closed_at is not None
    assert decided.body["temperature"] == 0.5 and decided.path.startswith("/a/")


def test_a_tag_the_speculation_could_not_know_resends_the_request_with_it(upstream: RecordingUpstream) -> None:
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        raw = raw_post(proxy.port, PATHS["chat"], body("chat", "slow label", False))
    assert status_of(raw) == 200 and header_of(raw, "x-d3-speculative") == "changed"
    speculative, decided = upstream.seen
    assert "x-team" not in speculative.headers and speculative.closed_at is not None
    assert decided.headers["x-team"] == "blue"


def test_a_client_that_leaves_cancels_the_decision_and_the_upstream_request(upstream: RecordingUpstream) -> None:
    engine = Timed(5.0)
    with served(upstream, engine) as proxy:
        data = json.dumps(body("chat", "slow", False)).encode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
            assert wait_for(lambda: bool(upstream.seen)), "the speculative request never started"
        left = time.monotonic()
        assert wait_for(lambda: upstream.seen[0].closed_at is not None), "the upstream request outlived the client"
        assert wait_for(lambda: engine.cancelled == 1), "the decision went on after the client left"
        metrics = httpx.get(f"{proxy.url}/metrics").text
    closed_at = upstream.seen[0].closed_at
    assert closed_at is not None and closed_at - left < 3.5 and not engine.done_at
    assert 'd3router_speculations_total{outcome="abandoned",policy="auto"} 1.0' in metrics


def test_metrics_count_started_used_cancelled_and_the_wasted_tokens(upstream: RecordingUpstream) -> None:
    engine = Timed(DECISION_S)
    with served(upstream, engine) as proxy:
        for text in ("hello", "forbidden", "elsewhere"):
            assert status_of(raw_post(proxy.port, PATHS["chat"], body("chat", text, False))) in (200, 403)
        metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'd3router_speculations_started_total{policy="auto"} 3.0' in metrics
    for outcome in ("used", "blocked", "rerouted"):
        assert f'd3router_speculations_total{{outcome="{outcome}",policy="auto"}} 1.0' in metrics
    # The blocked and the rerouted answers had come whole (0.05 s) before the decision (0.3 s): their usage counts.
    assert 'd3router_speculation_wasted_tokens_total{kind="input",policy="auto"} 22.0' in metrics
    assert 'd3router_speculation_wasted_tokens_total{kind="output",policy="auto"} 14.0' in metrics


def test_the_decision_log_says_the_outcome(upstream: RecordingUpstream, tmp_path: Any) -> None:
    log = tmp_path / "decisions.jsonl"
    engine = Timed(DECISION_S)
    text = config_text(upstream).replace("server: {", f'server: {{decision_log: {{path: "{log}"}}, ', 1)
    with Served(create_app(parse_config(text), engine=engine)) as proxy:
        raw_post(proxy.port, PATHS["chat"], body("chat", "forbidden", False))
        raw_post(proxy.port, PATHS["chat"], body("chat", "hello", False))
    assert wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == 2)
    blocked, used = (json.loads(line) for line in log.read_text().splitlines())
    assert blocked["overlap"] == {"outcome": "blocked", "upstream": "a",
                                  "wasted_tokens": {"input": 11, "output": 7}}  # fmt: skip
    assert used["overlap"] == {"outcome": "used", "upstream": "a"}


def test_the_header_is_for_debugging_callers_only(upstream: RecordingUpstream) -> None:
    engine = Timed(0.01)
    with served(upstream, engine, expose=False) as proxy:
        raw = raw_post(proxy.port, PATHS["chat"], body("chat", "hello", False))
    assert status_of(raw) == 200 and header_of(raw, "x-d3-speculative") is None


def test_sticky_speculates_on_the_sessions_route_only(upstream: RecordingUpstream) -> None:
    engine = Timed(DECISION_S)
    with served(upstream, engine, overlap="{when: sticky}", session="sticky") as proxy:
        session = {"x-session-id": "s1"}
        first = raw_post(proxy.port, PATHS["chat"], body("chat", "elsewhere", False), session)  # routed to b: stored
        later = raw_post(proxy.port, PATHS["chat"], body("chat", "hello", False), session)  # sticky on b
        blocked = raw_post(proxy.port, PATHS["chat"], body("chat", "forbidden", False), session)
    assert header_of(first, "x-d3-speculative") == "none" and header_of(first, "x-d3-upstream") == "b"
    assert header_of(later, "x-d3-speculative") == "used" and header_of(later, "x-d3-upstream") == "b"
    assert header_of(later, "x-d3-session") == "sticky"
    assert status_of(blocked) == 403 and MARK.encode() not in blocked  # the session never replaces a guard
    assert [seen.path.split("/")[1] for seen in upstream.seen] == ["b", "b", "b"]
    assert upstream.seen[1].at < engine.done_at[1]


def test_agreeing_waits_for_agreeing_decisions(upstream: RecordingUpstream) -> None:
    engine = Timed(0.05)
    with served(upstream, engine, overlap="{when: agreeing, agreed: 2}", session="sticky") as proxy:
        session = {"x-session-id": "s2"}
        shown = [header_of(raw_post(proxy.port, PATHS["chat"], body("chat", text, False), session),
                           "x-d3-speculative") for text in ("hi", "hi", "hi", "forbidden", "hi")]  # fmt: skip
    # Two agreeing decisions before the first speculation; a block (speculated on, cancelled) resets the count.
    assert shown == ["none", "none", "used", "blocked", "none"]


def test_an_answer_guard_judges_the_speculative_answer(upstream: RecordingUpstream) -> None:
    engine = Timed(DECISION_S)
    guard = """    answer:
      questions: {leak: {type: noul}}
      rules: [{name: no-leak, when: leak > 0.5, block: {status: 451, message: withheld}}]
"""
    engine.answers = lambda state, questions: {"leak": 0.9} if "leak" in questions else Timed.table(state, questions)
    with Served(create_app(parse_config(config_text(upstream) + guard), engine=engine)) as proxy:
        raw = raw_post(proxy.port, PATHS["chat"], body("chat", "hello", False))
    assert status_of(raw) == 451 and MARK.encode() not in raw
    assert header_of(raw, "x-d3-speculative") == "used" and len(upstream.seen) == 1
