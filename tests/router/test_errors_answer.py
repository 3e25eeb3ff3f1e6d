"""The error tree's answers (router/_errors.py `answer`): each error's status, its words and where, and the headers
that tell a client when (or whether) to try again. Pinned where mutmut found changes no test of its selection
noticed (issue 23)."""

from __future__ import annotations

import json

from router import API_BY_NAME
from router._errors import SDK_WAIT_S, BadRequest, ModelNotFound, Overloaded, RateLimited, Unauthorized, answer

CHAT = API_BY_NAME["chat"]


def test_a_503_says_when_to_try_again_and_nothing_else_does() -> None:
    assert answer(Overloaded("full"), CHAT)[2] == [(b"retry-after", b"1")]
    assert answer(Overloaded("full", status=504), CHAT)[2] == []
    assert answer(BadRequest("bad"), CHAT)[2] == []


def test_a_rate_limit_says_its_wait_and_past_the_sdks_patience_not_to_retry() -> None:
    assert answer(RateLimited("slow down", SDK_WAIT_S), CHAT)[2] == [(b"retry-after", str(SDK_WAIT_S).encode())]
    assert answer(RateLimited("used up", SDK_WAIT_S + 1), CHAT)[2] == [
        (b"retry-after", str(SDK_WAIT_S + 1).encode()), (b"x-should-retry", b"false")]  # fmt: skip
    status, body, _ = answer(RateLimited("slow down", 3), CHAT)
    assert (status, json.loads(body)["error"]["message"]) == (429, "slow down")


def test_the_errors_keep_what_they_are_given() -> None:
    refused = Unauthorized("no key", "authorization", 403, "forbidden-key")
    assert (refused.message, refused.param, refused.status, refused.code) == (
        "no key", "authorization", 403, "forbidden-key")  # fmt: skip
    assert answer(refused, CHAT)[2] == [(b"www-authenticate", b'Bearer realm="d3-router"')]
    missing = ModelNotFound("no such model", "model", 400)
    assert (missing.message, missing.param, missing.status, missing.code) == (
        "no such model", "model", 400, "model_not_found")  # fmt: skip
    assert (ModelNotFound("m").status, Unauthorized("u").status, Unauthorized("u").code) == (
        404,
        401,
        "invalid_api_key",
    )
