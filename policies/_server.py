"""The configuration's `server:` section: what the router serves, how it logs decisions, keeps sessions and shares
state (pydantic models at the trust boundary, strict about unknown keys)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from policies._access import AuthSettings
from policies._strict import HEADER_NAME, Strict, check_env

_PASSTHROUGH_PATH = re.compile(r"^/v1/[A-Za-z0-9._~/-]*\*?$")


class DecisionLogSettings(Strict):
    """One JSON line per decision: policy, rule, upstream, answers, timing; no message text by default."""

    path: str = Field(description="A JSON-lines file, one line per decided request.")
    include_text: bool = Field(False, description="Also log the decision state (message text). Off by default.")
    states: bool = Field(
        False,
        description="Log what `d3router replay` needs to decide again: the decision state (message text: see the "
        "privacy note in docs/replay.md), its source and its media counts. Off by default.",
    )
    max_state_chars: int = Field(
        20_000, gt=0, description="With `states`: a longer state is not logged (the line says so), never cut."
    )


class SessionServerSettings(Strict):
    """How a request's session is found; keys are hashed (BLAKE2, salted) before they are stored or logged."""

    session_id_header: bool = Field(True, description="Read the `x-session-id` request header.")
    header: str | None = Field(None, description="Another header holding a session id, read after x-session-id.")
    body_ids: bool = Field(
        True,
        description="Read the body's `user`, `safety_identifier`, `prompt_cache_key` (chat, responses) and "
        "`metadata.user_id` (messages), and follow a Responses `previous_response_id` chain.",
    )
    agent_ids: bool = Field(
        True,
        description="Read coding agents' own conversation ids: Claude Code's `x-claude-code-session-id` header and the "
        "`session_id` inside `metadata.user_id`, Codex's `session-id` / `thread-id` headers, and `prompt_cache_key`. "
        "A different opening inside one such session (a sub-agent, a compacted history) starts on the session's route "
        "and never overwrites the route of the conversation that opened it.",
    )
    fingerprint: bool = Field(
        True,
        description="With no id at all, the session is the conversation's opening (system prompt and first user turn, "
        "with the client's credential hashed in).",
    )
    salt_env: str | None = Field(
        None,
        description="Environment variable holding the salt of hashed session and cache keys. Unset: a random salt per "
        "process; with server.redis it is required (replicas must agree on it, and no one reading Redis may test a "
        "guessed prompt), e.g. `openssl rand -hex 32` in a secret every replica reads.",
    )
    max_entries: int = Field(100_000, gt=0, description="Sessions the in-process store keeps (oldest dropped first).")

    @field_validator("header")
    @classmethod
    def _header(cls, name: str | None) -> str | None:
        if name is not None and not HEADER_NAME.match(name):
            raise PydanticCustomError("header", "expected a header name, found {n}", {"n": repr(name)})
        return None if name is None else name.lower()

    @field_validator("salt_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        return check_env(name)


class ServerSettings(Strict):
    """How the router serves: limits, admin access and graceful shutdown."""

    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Larger request bodies get 413.")
    max_concurrent_requests: int = Field(
        512,
        gt=0,
        description="Requests one process serves at once; more get 503 with Retry-After (in the API's "
        "shape) at once, before their bodies are read.",
    )
    max_buffered_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Request-body bytes one process holds at once, across its requests; a "
        "request whose body would pass it gets 503 with Retry-After. With max_body_bytes, it bounds the memory a burst "
        "of large bodies can take (measured: benchmarks/README.md).",
    )
    decision_timeout_s: float = Field(5.0, gt=0, description="Longest wait for the engine before on_engine_error.")
    media_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts whose http(s) image/video URLs may be handed to the engine (which fetches them); "
        "others are dropped and said so in x-d3-media-dropped. Data URLs always pass.",
    )
    max_media_bytes: int = Field(8 * 1024 * 1024, gt=0, description="Budget for data URLs handed to the engine.")
    admin_token_env: str | None = Field(None, description="Environment variable with the token for POST /admin/reload.")
    decision_log: DecisionLogSettings | None = Field(None, description="Unset: no decision log is written.")
    default_policy: str | None = Field(
        None,
        description="The policy that decides a request whose `model` names no policy (an upstream's model, any "
        "other name). Unset, such a request gets 404 model_not_found unless server.undecided_models lists it.",
    )
    undecided_models: list[str] = Field(
        default_factory=list,
        description="Models (an upstream's name or its `model`; `*` for any) that, with no policy of that name and "
        "no server.default_policy, go undecided to the upstream serving them. Empty by default: nothing reaches an "
        "upstream without a decision. `d3router check` warns when set.",
    )
    auth: AuthSettings | None = Field(
        None, description="Client keys (who may call, what each may use, rate limits); unset: no authentication."
    )
    expose_decisions: bool = Field(
        False,
        description="Show every caller the debug headers (x-d3-rule, x-d3-answers, x-d3-cache, x-d3-upstream, tags, "
        "...). Off: only keys with `debug` see them; others get x-d3-policy, x-d3-action and x-d3-session.",
    )
    metrics_token_env: str | None = Field(
        None, description="Environment variable with a bearer token GET /metrics then needs; unset: open."
    )
    readyz_interval_s: float = Field(
        5.0, gt=0, description="/readyz answers from the last engine probe, probing at most once per interval."
    )
    passthrough: list[str] = Field(
        default_factory=list,
        description="Other /v1 paths passed undecided to the first upstream, e.g. /v1/embeddings or /v1/files/*. "
        "Others get 404. Empty by default: nothing reaches an upstream without a decision unless listed here.",
    )
    unknown_parts: Literal["refuse", "ignore"] = Field(
        "refuse",
        description="A content part or item the router cannot read (audio, files, unknown types): refuse with "
        "400, or leave it out of the decision state and say so in x-d3-parts-ignored.",
    )
    max_media_items: int = Field(
        16, ge=0, description="Images and videos one request may hand to the engine; more get 413."
    )
    answer_model: Literal["client", "upstream"] = Field(
        "client",
        description="The model a routed answer names when the route rewrote the request's model: `client`, the name "
        "the client asked for (in JSON answers and stream events; Claude Code sends thinking blocks back only then), "
        "or `upstream`, the upstream's answer as it came.",
    )

    sessions: SessionServerSettings = SessionServerSettings()
    redis: str | None = Field(
        None,
        description="redis://host:6379/0 (or rediss://): sessions are kept in this Redis, shared by replicas. Slow or "
        "down, the router falls back to its in-process store (counted in /metrics) and returns to Redis by itself.",
    )
    redis_timeout_s: float = Field(
        0.05,
        gt=0,
        le=5,
        description="Longest wait for one Redis call before the in-process store answers instead (and, apart, for a "
        "free connection when all redis_max_connections are in use: that is counted as busy, not as Redis down).",
    )
    redis_max_connections: int = Field(
        32,
        gt=0,
        le=10_000,
        description="Connections of this process's Redis pool at most (each worker has its own pool; the Lua scripts "
        "of rate limits and budgets use one pipelined connection more, router/_sessions/pipe.py). More calls at "
        "once wait for a free one, at most redis_timeout_s (then busy: answered in-process, Redis not taken for "
        "down). Larger is not faster: the event loop, not Redis, limits one process's calls "
        "(router/_sessions/store.py).",
    )

    drain_s: float = Field(
        5.0,
        ge=0,
        description="On SIGTERM, /readyz answers 503 at once while new connections are still served this long: the "
        "load balancer's lag in taking the router out of rotation.",
    )
    grace_s: int = Field(
        30,
        ge=0,
        description="After the drain, in-flight requests and streams get this many seconds to finish before they are "
        "cut and the process exits (Kubernetes: terminationGracePeriodSeconds >= drain_s + grace_s).",
    )

    @field_validator("passthrough")
    @classmethod
    def _paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            segments = path.rstrip("*").split("/")
            if not _PASSTHROUGH_PATH.match(path) or any(seg in (".", "..") for seg in segments):
                raise PydanticCustomError(
                    "path",
                    "expected a path under /v1/ (a trailing * matches the rest), found {p}",
                    {"p": repr(path)},
                )
        return paths

    @field_validator("admin_token_env", "metrics_token_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        return check_env(name)

    @model_validator(mode="after")
    def _salted(self) -> ServerSettings:
        if self.redis is not None and self.sessions.salt_env is None:
            raise PydanticCustomError(
                "salt",
                "server.redis shares hashed session and cache keys between replicas, so they need a secret salt: "
                "set server.sessions.salt_env to a variable every replica reads (e.g. from `openssl rand -hex 32`)",
            )
        return self

    @field_validator("redis")
    @classmethod
    def _redis(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^(rediss?|unix)://\S+$", url):
            raise PydanticCustomError(
                "redis", "expected a redis://host:port/db URL (or rediss://, unix://), found {u}", {"u": repr(url)}
            )
        return url
