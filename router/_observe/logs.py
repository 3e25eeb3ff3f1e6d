"""Request ids and the log format of `d3router serve` (issue 14.6).

Every response of the proxy carries `x-request-id`: the client's own when it is a sane token (`SANE_ID`), else
one made here; the upstream request carries the same id. While a request is served its id (and, once known, its
policy, rule and upstream) is in a context variable that a filter copies onto every log record, so each line about
the request names it, in either format:

    d3router serve router.yaml --log-format json     # one JSON object per line on stderr, for log shippers
    {"time": "2026-12-01T20:24:19.123Z", "level": "INFO", "logger": "router.access",
     "message": "POST /v1/chat/completions 200 12.41 ms", "request_id": "9f0c...", "policy": "auto",
     "rule": "hard-code", "upstream": "large", "status": 200, "duration_ms": 12.41}

The access line (logger `router.access`, one INFO line per request; DEBUG for `/healthz`, `/readyz` and
`/metrics`, which probes call every few seconds) is on by default with `--log-format json` and off with `text`
(`--access-log` / `--no-access-log` choose). Bodies, prompts and keys are never logged.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.types import Message, Scope, Send

from router._asgi.headers import header

ACCESS_LOGGER = "router.access"
SANE_ID = re.compile(r"[A-Za-z0-9._:+/=@-]{1,128}")  # what a client's x-request-id may be to be kept as it is
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_FIELDS = ("request_id", "caller", "policy", "rule", "upstream", "status", "duration_ms")

access = False  # `d3router serve`: one line per request to `router.access`, whose level says whether it shows
_access_logger = logging.getLogger(ACCESS_LOGGER)


@dataclass(slots=True)
class RequestInfo:
    """What is known about the request being served: its id, then what the router decided for it."""

    id: str
    method: str
    path: str
    start: float
    status: int = 0
    api: str | None = None
    policy: str | None = None
    rule: str | None = None
    action: str | None = None
    upstream: str | None = None
    caller: str | None = None  # key:NAME, or anon:HASH of the credential (issue 25.3)
    cache: str | None = None
    degraded: bool = False


CURRENT: ContextVar[RequestInfo | None] = ContextVar("d3router_request", default=None)


def current() -> RequestInfo | None:
    """The request being served in this task, if any."""
    return CURRENT.get()


def request_id() -> str | None:
    info = CURRENT.get()
    return None if info is None else info.id


def begin(scope: Scope, send: Send) -> tuple[RequestInfo, Token[RequestInfo | None], Send]:
    """Start serving `scope`: its request id, in the context and on the response (`end` closes it)."""
    value = header(scope["headers"], b"x-request-id")
    given = None if value is None else value.decode("latin-1")
    rid = given if given is not None and SANE_ID.fullmatch(given) else os.urandom(16).hex()  # uuid4: 4x the time
    info = RequestInfo(rid, scope["method"], scope["path"], time.perf_counter())
    token = CURRENT.set(info)
    ours = rid.encode("latin-1")

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            info.status = message["status"]
            headers = [
                (b"x-upstream-request-id", v) if k.lower() == b"x-request-id" else (k, v)
                for k, v in message.get("headers", ())
                if k.lower() != b"x-request-id" or v != ours  # an upstream echoing ours back: not twice
            ]  # an upstream's own id is kept under another name: the response has one x-request-id, ours
            headers.append((b"x-request-id", ours))
            message = {**message, "headers": headers}
        await send(message)

    return info, token, send_with_id


def end(info: RequestInfo, token: Token[RequestInfo | None]) -> None:
    """The request is answered (or its client left: 499): the access line, if on; the context is reset."""
    try:
        if access:
            level = logging.DEBUG if info.path in _QUIET_PATHS else logging.INFO
            if _access_logger.isEnabledFor(level):
                status = info.status or 499  # no response started: the client left first (nginx's 499)
                duration_ms = round((time.perf_counter() - info.start) * 1000.0, 2)
                _access_logger.log(level, "%s %s %d %.2f ms", info.method, info.path, status, duration_ms,
                                   extra={"status": status, "duration_ms": duration_ms})  # fmt: skip
    finally:
        CURRENT.reset(token)


def noted(info: RequestInfo | None, d3: Any) -> None:
    """Keep what the router decided (a `D3Decision`) on the request's record, for its log lines and trace."""
    if info is None:
        return
    info.policy, info.rule, info.action = d3.policy, d3.decision.rule, d3.decision.action.kind
    info.cache = "hit" if d3.cached else ("none" if not d3.answers else "miss")
    info.degraded = d3.decision.degraded


class RequestFilter(logging.Filter):
    """Copies the current request's id, policy, rule and upstream onto each record (fields a record was given
    through `extra` win). On the handler, so that it runs in the task that logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = CURRENT.get()
        if info is not None:
            for name, value in (("request_id", info.id), ("caller", info.caller), ("policy", info.policy),
                                ("rule", info.rule), ("upstream", info.upstream)):  # fmt: skip
                if value is not None and not hasattr(record, name):
                    setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the request's fields when
    known; a traceback is one escaped string (`exception`), never lines of its own."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        entry: dict[str, Any] = {
            "time": stamp.replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, and `[request_id]` after a line about a request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        rid = getattr(record, "request_id", None)
        return text if rid is None else f"{text} [{rid}]"


def log_config(log_format: str, level: str, access_log: bool | None = None) -> dict[str, Any]:
    """The `logging.config.dictConfig` of `d3router serve`, given to uvicorn too (its workers apply it), so that
    uvicorn's own lines come out in the same format. `access_log=None`: access lines with the JSON format only."""
    if log_format not in ("text", "json"):
        raise ValueError(f"unknown log format {log_format!r}; expected 'text' or 'json'")
    access_on = log_format == "json" if access_log is None else access_log
    formatter = "router._observe.logs.JsonFormatter" if log_format == "json" else "router._observe.logs.TextFormatter"
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "d3router"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request": {"()": "router._observe.logs.RequestFilter"}},
        "formatters": {"d3router": {"()": formatter}},
        "handlers": {"stderr": {**handler, "filters": ["request"]}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            **{name: {"handlers": [], "propagate": True} for name in ("uvicorn", "uvicorn.error")},
            ACCESS_LOGGER: {"level": "NOTSET" if access_on else "WARNING"},  # NOTSET: the root's level
        },
    }


def apply(config: dict[str, Any]) -> None:
    """Use `config` (from `log_config`) in this process: a worker started by uvicorn calls it too."""
    import logging.config

    global access
    logging.config.dictConfig(config)
    json_lines = config["formatters"]["d3router"]["()"].endswith("JsonFormatter")
    logging.captureWarnings(json_lines)  # warnings through logging: JSON lines too
    access = True
