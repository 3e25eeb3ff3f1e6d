"""What a request can end in besides the upstream's answer, as one tree, and the table that gives each its status and
error type. Each API's adapter writes the body in its own shape (`api.error(...)`); `answer` is the one place that
turns an error into a status, a body and headers, for the proxy and the middleware alike.

    RequestError               an error answer instead of the upstream's (500 if raised bare)
     +-- BadRequest            400 invalid_request_error: the body, a parameter, a header
     |    +-- BodyTooLarge     413 (server.max_body_bytes, server.max_media_items)
     |    +-- NotJson          415 (a content type other than application/json)
     |    +-- ModelNotFound    404 model_not_found (no policy or upstream serves the model for this API)
     +-- Blocked               the rule's status (403 by default) policy_violation, its code the rule's name
     +-- UpstreamFailed        502 (unreachable, broke off), 503 (no free connection; Retry-After), 504 (timed out)
     +-- Overloaded            503 overloaded_error (server.max_concurrent_requests, max_buffered_bytes; Retry-After)
     +-- NoRoute               404 not_found_error (a path the router does not serve)
     +-- Forbidden             403 permission_error (the admin token, explain, /metrics' token)
     +-- Unauthorized          401 invalid_api_key (server.auth: no key, a wrong one); Anthropic authentication_error
     +-- RateLimited           429 rate_limit_exceeded, with Retry-After (the key's or its group's rate)

    try:
        ...
    except RequestError as exc:
        status, body, headers = answer(exc, api)
"""

from __future__ import annotations

from typing import ClassVar, Protocol


class RequestError(Exception):
    """The request ends in an error answer; `param` names the offending field and `code` a machine-readable reason,
    as OpenAI's errors do. `status` overrides the class's own (a block's status is its rule's)."""

    status_default: ClassVar[int] = 500

    def __init__(self, message: str, param: str | None = None, status: int | None = None, code: str | None = None
                 ) -> None:  # fmt: skip
        self.message = message
        self.param = param
        self.status = self.status_default if status is None else status
        self.code = code
        super().__init__(message)


class BadRequest(RequestError, ValueError):
    """The request cannot be decided as it is."""

    status_default = 400


class BodyTooLarge(BadRequest):
    status_default = 413


class NotJson(BadRequest):
    status_default = 415


class ModelNotFound(BadRequest):
    status_default = 404

    def __init__(self, message: str, param: str | None = "model", status: int | None = None,
                 code: str | None = "model_not_found") -> None:  # fmt: skip
        super().__init__(message, param, status, code)


class Blocked(RequestError):
    """A rule blocked the request: its status and message, the rule's name as the code; `as_answer`: answered as the
    model would (a normal assistant answer saying the message, 200), not as an error (issue 26.2)."""

    status_default = 403

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None, as_answer: bool = False
                 ) -> None:  # fmt: skip
        super().__init__(message, status=status, code=code)
        self.as_answer = as_answer


class UpstreamFailed(RequestError):
    """No upstream answered: 502 (unreachable, or it broke off before anything reached the client), 503 (no free
    connection in its pool), 504 (it did not answer in time)."""

    status_default = 502


class Overloaded(RequestError):
    """The process serves as many requests, or holds as many body bytes, as it may: try again shortly."""

    status_default = 503


class NoRoute(RequestError):
    status_default = 404


class Forbidden(RequestError):
    status_default = 403


class Unauthorized(RequestError):
    """No client key, or one the router does not know (server.auth); answered before the body is read."""

    status_default = 401

    def __init__(self, message: str, param: str | None = None, status: int | None = None,
                 code: str | None = "invalid_api_key") -> None:  # fmt: skip
        super().__init__(message, param, status, code)


class RateLimited(RequestError):
    """The caller's key or group is over its rate; `retry_after_s` says when the next request is allowed."""

    status_default = 429

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, None, None, "rate_limit_exceeded")
        self.retry_after_s = retry_after_s


# Most specific first, as httpx's HTTPCORE_EXC_MAP: the first class the error is an instance of gives its type.
ERROR_TYPES: tuple[tuple[type[RequestError], str], ...] = (
    (BadRequest, "invalid_request_error"),
    (Blocked, "policy_violation"),
    (UpstreamFailed, "upstream_error"),
    (Overloaded, "overloaded_error"),
    (NoRoute, "not_found_error"),
    (Forbidden, "permission_error"),
    (Unauthorized, "invalid_request_error"),  # as OpenAI answers a wrong key, code invalid_api_key
    (RateLimited, "rate_limit_error"),
    (RequestError, "server_error"),
)
RETRY_AFTER_S = 1  # a 503 says when to try again: a pool frees connections within a request's time


class ErrorShape(Protocol):
    """What `answer` needs of an API adapter: its error body (router/_apis)."""

    def error(self, status: int, message: str, type_: str, code: str | int | None = None, param: str | None = None
              ) -> bytes: ...  # fmt: skip


# The openai and anthropic SDKs retry a 429 by default and sleep its whole Retry-After (the anthropic SDK at any
# length); past this, the answer also says `x-should-retry: false`, which both honour: the caller sees the error now.
SDK_WAIT_S = 60


def error_type(exc: RequestError) -> str:
    return next(type_ for cls, type_ in ERROR_TYPES if isinstance(exc, cls))


def answer(exc: RequestError, api: ErrorShape) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """The status, the body in `api`'s shape and the headers that answer `exc`."""
    body = api.error(exc.status, exc.message, error_type(exc), exc.code, exc.param)
    headers = [(b"retry-after", str(RETRY_AFTER_S).encode())] if exc.status == 503 else []
    if isinstance(exc, RateLimited):
        headers = [(b"retry-after", str(exc.retry_after_s).encode())]
        if exc.retry_after_s > SDK_WAIT_S:  # a budget until tomorrow: the SDKs would sleep that long, then fail
            headers.append((b"x-should-retry", b"false"))
    elif isinstance(exc, Unauthorized):
        headers = [(b"www-authenticate", b'Bearer realm="d3-router"')]  # RFC 6750 3
    return exc.status, body, headers
