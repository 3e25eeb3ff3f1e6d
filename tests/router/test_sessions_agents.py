"""Sessions agents keep (issue 26.4), in-process: the agents' own conversation ids, a sub-agent's opening inside the
parent's session, a compacted history, streamed and compressed Responses answers whose ids chain."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from d3backend import FakeEngine
from policies import parse_config
from router import ProxyApp, create_app
from router._asgi.decoding import Decoder, FirstResponse, decoded
from tests.router._asgi import post_noting_the_end
from tests.router.test_sessions import RecordingStore

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{expose_decisions: true, sessions: {{agent_ids: {agent_ids}}}}}
upstreams:
  small: {{url: http://small.test/v1, model: small-model, tier: 1}}
  large: {{url: http://large.test/v1, model: big-model, tier: 2}}
policies:
  climb:
    session: {{mode: escalate, ttl_s: 60}}
    questions: {{hard: {{type: noul}}}}
    rules:
      - {{name: hard, when: hard > 0.5, route: large}}
      - {{name: default, route: small}}
"""

CLAUDE_USER_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": "5c1f-parent"})


def answers(state: Any, questions: Any) -> dict[str, Any]:
    return {"hard": 0.9 if "HARD" in json.dumps(state) else 0.1}


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)


def responder(name: str, *, encoding: str = "", stream: bool = False) -> Any:
    count = [0]

    def respond(request: httpx.Request) -> httpx.Response:
        count[0] += 1
        answer = {"id": f"resp_{name}_{count[0]}", "object": "response", "output": []}
        if stream:
            body = sse({"type": "response.created", "response": answer}, {"type": "response.completed",
                                                                            "response": answer})  # fmt: skip
            headers = {"content-type": "text/event-stream"}
        else:
            body, headers = json.dumps(answer).encode(), {"content-type": "application/json"}
        if encoding == "gzip":
            body = gzip.compress(body)
        elif encoding == "deflate":
            body = zlib.compress(body)
        if encoding:
            headers["content-encoding"] = encoding
        return httpx.Response(200, content=body, headers=headers)

    return respond


async def start(tmp_path: Path, agent_ids: bool = True) -> ProxyApp:
    config = parse_config(CONFIG.format(agent_ids=str(agent_ids).lower()), str(tmp_path / "c.yaml"))
    proxy = create_app(config, engine=FakeEngine(answers), transport=httpx.AsyncHTTPTransport())
    await proxy.startup()
    return proxy


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[ProxyApp]:
    with respx.mock(assert_all_called=False) as mock:
        for name in ("small", "large"):
            mock.post(f"http://{name}.test/v1/messages").mock(return_value=httpx.Response(200, json={"up": name}))
            mock.post(f"http://{name}.test/v1/responses").mock(side_effect=responder(name))
        proxy = await start(tmp_path)
        yield proxy
        await proxy.aclose()


@pytest.fixture
async def client(app: ProxyApp) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
        yield http


def seen(response: httpx.Response) -> tuple[str | None, str | None]:
    return response.headers.get("x-d3-upstream"), response.headers.get("x-d3-session")


def messages(opening: str, *later: dict[str, Any], metadata: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "climb", "max_tokens": 9, "system": "You are Claude Code.",
                            "messages": [{"role": "user", "content": opening}, *later]}  # fmt: skip
    if metadata:
        body["metadata"] = metadata
    return body


def tool_turn(text: str) -> list[dict[str, Any]]:
    """An assistant's tool call and its result, then nothing: the agent's next step."""
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": text}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": text}]},
    ]


CLAUDE = {"x-claude-code-session-id": "5c1f-parent"}
AGENT_IDS = [
    "claude-header",
    "claude-user-id",
    "claude-user-id-legacy",
    "codex-session-id",
    "codex-thread-id",
    "cache-key",
]


async def test_a_sub_agent_never_overwrites_its_parents_route(client: httpx.AsyncClient) -> None:
    """Claude Code's Agent tool: the sub-agent shares the session id and has an opening of its own."""
    parent = await client.post("/v1/messages", json=messages("read the file"), headers=CLAUDE)
    assert seen(parent) == ("small", "new")
    # The sub-agent starts on the session's route, and its own escalation stays its own.
    sub = await client.post("/v1/messages", json=messages("sub-agent: find the file"), headers=CLAUDE)
    assert seen(sub) == ("small", "sticky")
    sub = await client.post("/v1/messages", json=messages("sub-agent: find the file", *tool_turn("x"),
                                                          {"role": "user", "content": "a HARD one"}), headers=CLAUDE)  # fmt: skip
    assert seen(sub) == ("large", "escalated")
    sub = await client.post("/v1/messages", json=messages("sub-agent: find the file", *tool_turn("y")), headers=CLAUDE)
    assert seen(sub) == ("large", "sticky")
    # The parent's tool-result turn goes where the parent went.
    after = await client.post("/v1/messages", json=messages("read the file", *tool_turn("done")), headers=CLAUDE)
    assert seen(after) == ("small", "sticky")


@pytest.mark.parametrize(
    ("headers", "metadata", "cache_key"),
    [
        (CLAUDE, None, None),
        ({}, {"user_id": CLAUDE_USER_ID}, None),
        ({}, {"user_id": "user_" + "d" * 64 + "_account__session_5c1f-parent"}, None),
        ({"session-id": "019a-codex"}, None, None),
        ({"thread-id": "019a-codex"}, None, None),
        ({}, None, "019a-codex"),
    ],
    ids=AGENT_IDS,
)
async def test_a_compacted_history_keeps_its_session(
    client: httpx.AsyncClient, headers: dict[str, str], metadata: dict[str, str] | None, cache_key: str | None
) -> None:
    """After compaction the history opens anew (a summary, no assistant turn yet) under the same id: sticky."""
    path = "/v1/responses" if cache_key or "session-id" in headers or "thread-id" in headers else "/v1/messages"

    def body(opening: str) -> dict[str, Any]:
        if path == "/v1/messages":
            return messages(opening, metadata=metadata)
        extra = {"prompt_cache_key": cache_key} if cache_key else {}
        return {"model": "climb", "input": [{"role": "user", "content": opening}], **extra}

    assert seen(await client.post(path, json=body("a HARD task"), headers=headers)) == ("large", "new")
    compacted = await client.post(path, json=body("summary of the work so far"), headers=headers)
    assert seen(compacted) == ("large", "sticky")


async def test_agent_ids_off_reads_none_of_them(tmp_path: Path) -> None:
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://large.test/v1/messages").mock(return_value=httpx.Response(200, json={}))
        mock.post("http://small.test/v1/messages").mock(return_value=httpx.Response(200, json={}))
        proxy = await start(tmp_path, agent_ids=False)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://r") as client:
                assert seen(await client.post("/v1/messages", json=messages("a HARD task"), headers=CLAUDE)) == (
                    "large", "new")  # fmt: skip
                again = await client.post("/v1/messages", json=messages("summary"), headers=CLAUDE)
                assert seen(again) == ("small", "new")  # the opening's fingerprint: another conversation
        finally:
            await proxy.aclose()


@pytest.mark.parametrize(("encoding", "stream"), [("", True), ("gzip", False), ("deflate", False), ("gzip", True)])
async def test_a_streamed_or_compressed_responses_answer_chains(tmp_path: Path, encoding: str, stream: bool) -> None:
    with respx.mock(assert_all_called=False) as mock:
        for name in ("small", "large"):
            mock.post(f"http://{name}.test/v1/responses").mock(
                side_effect=responder(name, encoding=encoding, stream=stream)
            )
        proxy = await start(tmp_path)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://r") as client:
                first = await client.post("/v1/responses", json={"model": "climb", "input": "a HARD one",
                                                                  "stream": stream})  # fmt: skip
                assert seen(first) == ("large", "new")
                # A whole answer is decoded to name the client's model (issue 26.1); a coded stream passes as it came.
                assert first.headers.get("content-encoding", "") == (encoding if stream else "")
                second = await client.post("/v1/responses", json={"model": "climb", "input": "easy", "stream": stream,
                                                                   "previous_response_id": "resp_large_1"})  # fmt: skip
                assert seen(second) == ("large", "sticky")
        finally:
            await proxy.aclose()


async def test_a_streamed_answers_id_is_stored_before_the_stream_ends(tmp_path: Path) -> None:
    events: list[str] = []
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://large.test/v1/responses").mock(side_effect=responder("large", stream=True))
        proxy = await start(tmp_path)
        proxy.sessions.store = RecordingStore(events)
        try:
            body = json.dumps({"model": "climb", "input": "a HARD one", "stream": True, "user": "u-1"}).encode()
            await post_noting_the_end(proxy, "/v1/responses", body, events)
        finally:
            await proxy.aclose()
    assert events == ["remembered", "answered"]


def test_decoding_reads_each_encoding_and_gives_up_on_others() -> None:
    text = b'{"id": "resp_1"}'
    assert decoded(gzip.compress(text), "gzip") == text
    assert decoded(zlib.compress(text), "deflate") == text
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decoded(raw.compress(text) + raw.flush(), "Deflate") == text
    assert decoded(text, "identity") == text
    assert decoded(text, "br") is None
    assert decoded(b"not gzip", "gzip") is None
    # A stream's first response event, fed a byte at a time, whole once; nothing after.
    peek = FirstResponse(Decoder("gzip"))
    body = gzip.compress(sse({"type": "response.created", "response": {"id": "r"}}, {"type": "x", "response": {}}))
    found = [data for byte in body if (data := peek.feed(bytes([byte]))) is not None]
    assert [json.loads(data)["response"]["id"] for data in found] == ["r"]
    assert peek.done
    # An event stream without a response is read only so far.
    peek = FirstResponse(Decoder(""))
    for _ in range(70):
        peek.feed(b"data: " + b"x" * 1024 + b"\n\n")
    assert peek.done


async def test_an_answer_the_session_reads_is_asked_for_in_an_encoding_it_can_read(tmp_path: Path) -> None:
    """Codex asks for `zstd,gzip`: the upstream is asked for gzip alone when the router must read the answer."""
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post("http://small.test/v1/responses").mock(side_effect=responder("small"))
        chat = mock.post("http://small.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={}))
        proxy = await start(tmp_path)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://r") as client:
                asked = {"accept-encoding": "zstd, br;q=0.9, gzip;q=0.8"}
                await client.post("/v1/responses", json={"model": "climb", "input": "hi"}, headers=asked)
                await client.post("/v1/responses", json={"model": "climb", "input": "hi"},
                                  headers={"accept-encoding": "zstd"})  # fmt: skip
                body = {"model": "climb", "messages": [{"role": "user", "content": "hi"}]}
                await client.post("/v1/chat/completions", json=body, headers=asked)
        finally:
            await proxy.aclose()
    assert [call.request.headers["accept-encoding"] for call in route.calls] == ["gzip;q=0.8", "identity"]
    assert chat.calls.last.request.headers["accept-encoding"] == "zstd, br;q=0.9, gzip;q=0.8"  # not read: as sent
