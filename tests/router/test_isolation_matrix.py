"""Nothing shared across callers (issue 25.3), as a matrix: every source a session key is found by (the
`x-session-id` header, the configured header, the body's `user` / `safety_identifier` / `prompt_cache_key` /
`metadata.user_id`, the agents' own ids, `previous_response_id`, the opening's fingerprint) x every pair of callers
(keys on: two key names; keys off: two credentials, a credential and none, none and a credential).

Caller A opens a conversation that the engine sends to `large` and continues it (sticky, `large`). Caller B then
sends A's later turn with the same id: it is decided alone (`small`, a new session), its explain (the admin token,
as B) shows no route of A's, it sees no cache state (`x-d3-cache`: A's identical decision is in the cache), and a
Responses chain of A's is refused to it (400 previous_response_not_found): the upstream, called with the router's
own key, would otherwise continue A's conversation for B. The same for what the upstream keeps: a Responses
`conversation` A made (through `server.passthrough`) is A's session, and B naming it (either spelling), or one never
made, is 404 in OpenAI's shape for the request and for explain, as are its paths (`/v1/conversations/{id}`, its
items); A's stored response (`GET`/`DELETE /v1/responses/{id}`, `input_items`, `cancel`) is read from the upstream
that made it for A only. Nothing of B's then reaches an upstream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.router._callers import A, B, config_text, serving

pytestmark = pytest.mark.anyio

ADMIN = "admin-token-0123456789"
ENVIRON = {"KEY_A": A, "KEY_B": B, "ADMIN": ADMIN}
SERVER = """
server:
  admin_token_env: ADMIN
  sessions: {header: x-conversation}
  passthrough: ['/v1/*']
"""
CLAUDE_USER = json.dumps({"device_id": "d-1", "account_uuid": "", "session_id": "5f0c1e9a-claude-session"})


def answers(state: Any, questions: Any) -> dict[str, Any]:
    return {"hard": 0.9 if "HARD" in json.dumps(state).split("thanks")[-1] else 0.1}  # the last turn decides


@dataclass(frozen=True)
class Source:
    """A session key source: the path, and the body and headers of a turn given the conversation's user texts."""

    name: str
    path: str
    extra: dict[str, Any]
    headers: dict[str, str]

    def body(self, *texts: str) -> dict[str, Any]:
        turns: list[dict[str, Any]] = []
        for text in texts:
            turns += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        turns = turns[:-1]
        if self.path == "/v1/responses":
            return {"model": "auto", "input": turns, **self.extra}
        return {"model": "auto", "messages": turns, **self.extra, **({"max_tokens": 9} if "messages" in self.path
                                                                        else {})}  # fmt: skip


SOURCES = [
    Source("x-session-id", "/v1/chat/completions", {}, {"x-session-id": "s-1"}),
    Source("server.sessions.header", "/v1/chat/completions", {}, {"x-conversation": "c-1"}),
    Source("user", "/v1/chat/completions", {"user": "user-42"}, {}),
    Source("safety_identifier", "/v1/chat/completions", {"safety_identifier": "u-7"}, {}),
    Source("prompt_cache_key", "/v1/responses", {"prompt_cache_key": "pck-1"}, {}),
    Source("metadata.user_id", "/v1/messages", {"metadata": {"user_id": "user-42"}}, {}),
    Source("claude-code header", "/v1/messages", {}, {"x-claude-code-session-id": "cc-1"}),
    Source("claude-code user_id", "/v1/messages", {"metadata": {"user_id": CLAUDE_USER}}, {}),
    Source("codex session-id", "/v1/responses", {}, {"session-id": "codex-1"}),
    Source("codex thread-id", "/v1/responses", {}, {"thread-id": "thread-1"}),
    Source("fingerprint", "/v1/chat/completions", {}, {}),
]

Credential = Callable[[str], dict[str, str]]  # the credential headers for a path


def bearer(key: str) -> Credential:
    return lambda path: {"x-api-key": key} if path == "/v1/messages" else {"authorization": f"Bearer {key}"}


def nothing(path: str) -> dict[str, str]:
    return {}


# (id, keys on, A's credential, B's credential)
PAIRS: list[tuple[str, bool, Credential, Credential]] = [
    ("keys a-b", True, bearer(A), bearer(B)),
    ("no keys, two credentials", False, bearer(A), bearer(B)),
    ("no keys, credential-none", False, bearer(A), nothing),
    ("no keys, none-credential", False, nothing, bearer(B)),
]


Pair = tuple[httpx.AsyncClient, Credential, Credential]
SEEN: list[httpx.Request] = []  # what reached the upstreams, in order (the fixture empties it)


@pytest.fixture(params=PAIRS, ids=[pair[0] for pair in PAIRS])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    _, keys, first, second = request.param
    SEEN.clear()
    async with serving(config_text(SERVER, keys), answers, ENVIRON, SEEN) as client:
        yield client, first, second


HIDDEN = ("x-d3-cache", "x-d3-answers", "x-d3-rule", "x-d3-decision-ms", "x-d3-upstream")


@pytest.mark.parametrize("source", SOURCES, ids=[source.name for source in SOURCES])
async def test_caller_b_never_gets_a_session_of_caller_a(
    pair: tuple[httpx.AsyncClient, Credential, Credential], source: Source
) -> None:
    http, as_a, as_b = pair
    path, ids = source.path, source.headers
    opening = await http.post(path, json=source.body("HARD question"), headers={**ids, **as_a(path)})
    assert opening.json()["up"] == "large", opening.text
    later = source.body("HARD question", "thanks")
    own = await http.post(path, json=later, headers={**ids, **as_a(path)})
    assert (own.json()["up"], own.headers["x-d3-session"]) == ("large", "sticky")  # A's own session holds

    explained = await http.post("/v1/d3/explain", json=later, headers={**ids, **as_b(path), "x-d3-admin-token": ADMIN})
    assert explained.status_code == 200, explained.text
    assert (explained.json()["decision"]["upstreams"], explained.json()["session"]["outcome"]) == (["small"], "new")
    mine = await http.post("/v1/d3/explain", json=later, headers={**ids, **as_a(path), "x-d3-admin-token": ADMIN})
    assert mine.json()["decision"]["upstreams"] == ["large"]  # as A, explain shows A's session: the test can fail

    other = await http.post(path, json=later, headers={**ids, **as_b(path)})
    assert (other.json()["up"], other.headers["x-d3-session"]) == ("small", "new")  # B's own, decided alone
    assert not [name for name in HIDDEN if name in other.headers]  # the decision A's turn cached: not told to B


async def test_caller_b_cannot_continue_a_responses_chain_of_caller_a(
    pair: tuple[httpx.AsyncClient, Credential, Credential],
) -> None:
    http, as_a, as_b = pair
    path = "/v1/responses"
    first = await http.post(path, json={"model": "auto", "input": "HARD question"}, headers=as_a(path))
    assert first.json()["up"] == "large"
    body = {"model": "auto", "input": "thanks", "previous_response_id": first.json()["id"]}
    own = await http.post(path, json=body, headers=as_a(path))
    assert (own.json()["up"], own.headers["x-d3-session"]) == ("large", "sticky")
    for chained in (first.json()["id"], own.json()["id"]):  # any response of A's chain
        body["previous_response_id"] = chained
        stranger = await http.post(path, json=body, headers=as_b(path))
        assert stranger.status_code == 400, stranger.text
        error = stranger.json()["error"]
        assert (error["code"], error["param"]) == ("previous_response_not_found", "previous_response_id")
        explained = await http.post("/v1/d3/explain", json=body, headers={**as_b(path), "x-d3-admin-token": ADMIN})
        assert explained.status_code == 400 and "large" not in explained.text
    unknown = {**body, "previous_response_id": "resp_never_relayed"}  # an id the router never saw: B's own chain
    assert (await http.post(path, json=unknown, headers=as_b(path))).json()["up"] == "small"


def not_found(response: httpx.Response, param: str | None = None) -> None:
    """OpenAI's answer to an id it does not know: 404 invalid_request_error (the SDKs raise `NotFoundError`)."""
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error


async def test_caller_b_cannot_use_a_conversation_of_caller_a(pair: Pair) -> None:
    http, as_a, as_b = pair
    path = "/v1/responses"
    made = await http.post("/v1/conversations", json={}, headers=as_a(path))  # through server.passthrough
    assert made.status_code == 200, made.text
    conversation = made.json()["id"]
    first = await http.post(path, json={"model": "auto", "input": "HARD question", "conversation": conversation},
                            headers=as_a(path))  # fmt: skip
    assert first.json()["up"] == "large", first.text
    later = {"model": "auto", "input": "thanks", "conversation": {"id": conversation}}  # the history is upstream
    own = await http.post(path, json=later, headers=as_a(path))
    assert (own.json()["up"], own.headers["x-d3-session"]) == ("large", "sticky")  # the conversation is A's session
    assert (await http.get(f"/v1/conversations/{conversation}/items", headers=as_a(path))).status_code == 200
    seen = len(SEEN)

    for named in (conversation, {"id": conversation}, "conv_never_made"):  # A's, either spelling; one never made
        stranger = await http.post(path, json={**later, "conversation": named}, headers=as_b(path))
        not_found(stranger, "conversation")
        explained = await http.post("/v1/d3/explain", json={**later, "conversation": named},
                                    headers={**as_b(path), "x-d3-admin-token": ADMIN})  # fmt: skip
        assert explained.status_code == 404 and "large" not in explained.text
    for method, url in [("GET", f"/v1/conversations/{conversation}"), ("GET", f"/v1/conversations/{conversation}/items"),
                        ("POST", f"/v1/conversations/{conversation}/items"), ("POST", f"/v1/conversations/{conversation}"),
                        ("DELETE", f"/v1/conversations/{conversation}"), ("GET", "/v1/conversations/conv_never_made")]:  # fmt: skip
        not_found(await http.request(method, url, headers=as_b(path)))
    assert SEEN[seen:] == []  # nothing of B's reached an upstream (called with the router's key)


async def test_caller_b_cannot_read_a_stored_response_of_caller_a(pair: Pair) -> None:
    http, as_a, as_b = pair
    path = "/v1/responses"
    first = await http.post(path, json={"model": "auto", "input": "HARD question"}, headers=as_a(path))
    assert first.json()["up"] == "large"
    stored = first.json()["id"]
    urls = [("GET", f"/v1/responses/{stored}"), ("GET", f"/v1/responses/{stored}/input_items"),
            ("POST", f"/v1/responses/{stored}/cancel"), ("DELETE", f"/v1/responses/{stored}")]  # fmt: skip
    seen = len(SEEN)
    for method, url in [*urls, ("GET", "/v1/responses/resp_never_relayed")]:
        not_found(await http.request(method, url, headers=as_b(path)))
    assert SEEN[seen:] == []  # nothing of B's reached an upstream (called with the router's key)
    for method, url in urls:  # A's own, from the upstream that made it
        own = await http.request(method, url, headers=as_a(path))
        assert (own.status_code, own.json()["up"]) == (200, "large"), (method, url, own.text)
    assert [(r.method, r.url.path) for r in SEEN[seen:]] == [(m, u) for m, u in urls]
