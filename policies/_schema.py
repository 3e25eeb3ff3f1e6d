"""The configuration file's schema: pydantic models at the trust boundary, strict about unknown keys.

These models check the file's shape and types; `_load.py` then checks what crosses sections (route names,
`when` conditions, engine limits, test cases) and compiles policies. `d3router schema` prints their JSON Schema.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from d3backend import D3_MAX_OPTIONS, MAX_QUESTIONS, MAX_SCORE_LEVELS, MIN_SCORE_LEVELS
from policies._access import AuthSettings
from policies._facts import SCOPES
from policies._params import APIS, STRUCTURAL, ApiName
from policies._strict import HEADER_NAME, Strict, check_env, check_url

_RESERVED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "authorization",
        "cookie",
        "set-cookie",
    }
)
_QUESTION_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PASSTHROUGH_PATH = re.compile(r"^/v1/[A-Za-z0-9._~/-]*\*?$")


# --- engine ---------------------------------------------------------------------------------------------------
class EmbeddedSettings(Strict):
    """vLLM built inside the router's process (the default)."""

    model: str = Field("vllm-sr/d3-mini", min_length=1, description="Model name or local directory.")
    served_model_name: str | None = Field(
        None, description="The name vLLM serves the model under (its --served-model-name)."
    )
    max_model_len: int | None = Field(None, gt=0, description="Longest context in tokens (vLLM's --max-model-len).")
    dtype: str = Field("auto", description="Weights' data type (vLLM's --dtype).")
    kv_cache_memory_bytes: str | int | None = Field(None, description="e.g. 256M; leave unset on GPUs.")
    args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments.")
    timeout_s: float = Field(30.0, gt=0, description="Deadline of one decision (then on_engine_error applies).")


class RemoteSettings(Strict):
    """One or more vLLM servers serving `/v1/systemone`."""

    urls: list[str] = Field(min_length=1, description="Base URLs, e.g. http://d3-a:8000")
    model: str | None = Field(None, description="Served model name; discovered from /v1/models if unset.")
    timeout_s: float = Field(2.0, gt=0, description="Deadline of one try; a failed try is retried once on another URL.")
    connect_timeout_s: float = Field(0.5, gt=0, description="Longest wait to connect to one URL.")
    api_key_env: str | None = Field(None, description="Environment variable holding a bearer key.")

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            check_url(url)
        return urls

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        return check_env(name)


class DecisionsSettings(Strict):
    """A decision model behind the OpenAI Decisions API (`POST {url}/decisions`): a hosted one, or a gateway."""

    url: str = Field(description="Base URL including /v1, e.g. https://api.openai.com/v1")
    model: str = Field(min_length=1, description="The decision model's name, e.g. gpt-6-luna.")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key (a bearer token).")
    timeout_s: float = Field(5.0, gt=0, description="Deadline of one decision (no retry; then on_engine_error).")
    connect_timeout_s: float = Field(1.0, gt=0, description="Longest wait to connect.")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        check_url(url)
        return url

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        return check_env(name)


class CacheSettings(Strict):
    """The decision cache: answers kept by a digest of the model, the state and the questions (no text kept)."""

    max_entries: int = Field(
        10_000, ge=0, description="0 keeps no answers; identical decisions in flight still share one engine call."
    )
    ttl_s: float = Field(600.0, gt=0, description="Seconds an answer is kept (in Redis too, with server.redis).")


class PoolEngineSettings(Strict):
    """One engine of `engine.pool`: one kind, `remote` or `decisions`, tried in the pool's order."""

    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="What the decision log and /metrics call this engine; unset: its kind (remote, decisions).",
    )
    remote: RemoteSettings | None = None
    decisions: DecisionsSettings | None = None
    max_choice_options: int | None = Field(
        None,
        ge=2,
        le=D3_MAX_OPTIONS,
        description="Options a choice may have on this engine (26 for a generative model); unset: "
        "engine.max_choice_options.",
    )
    set_aside_s: float = Field(
        5.0,
        ge=0,
        description="Seconds this engine is skipped after it failed on its own account (unreachable, 5xx, timeout, "
        "429), so that the next one answers without waiting for it first; 0 never skips it.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> PoolEngineSettings:
        kinds = [name for name in ("remote", "decisions") if getattr(self, name) is not None]
        if len(kinds) != 1:
            raise PydanticCustomError(
                "engine_kind", "set one engine kind for a pool's engine (remote or decisions), found {kinds}",
                {"kinds": " and ".join(kinds) or "none"},
            )  # fmt: skip
        return self

    @property
    def kind(self) -> Literal["remote", "decisions"]:
        return "remote" if self.remote is not None else "decisions"

    @property
    def label(self) -> str:
        return self.name or self.kind

    @property
    def worst_s(self) -> float:
        """The longest one call to this engine may take: a remote try and its retry on another URL."""
        if self.remote is not None:
            return self.remote.timeout_s * min(2, len(self.remote.urls))
        return self.decisions.timeout_s if self.decisions is not None else 0.0


class EngineSettings(Strict):
    """The decision engine: `embedded` (the default), `remote` (vLLM servers), `decisions` (the OpenAI Decisions
    API) or a `pool` of remote and decisions engines tried in order, and its cache. Changes need a restart."""

    embedded: EmbeddedSettings | None = None
    remote: RemoteSettings | None = None
    decisions: DecisionsSettings | None = None
    pool: list[PoolEngineSettings] | None = Field(
        None,
        min_length=1,
        description="Engines tried in order, the first that answers deciding: e.g. d3 on vLLM, then a hosted "
        "decision model. Calibrate policies per engine: two models' probabilities differ.",
    )
    cache: CacheSettings = CacheSettings()
    max_choice_options: int = Field(
        D3_MAX_OPTIONS,
        ge=2,
        le=D3_MAX_OPTIONS,
        description="Options a choice may have: 255 for d3 models, 26 for generative models (labels A..Z).",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> EngineSettings:
        kinds = [name for name in ("embedded", "remote", "decisions", "pool") if getattr(self, name) is not None]
        if len(kinds) > 1:
            raise PydanticCustomError(
                "engine_kind", "set one engine kind (embedded, remote, decisions or pool), found {kinds}",
                {"kinds": " and ".join(kinds)},
            )  # fmt: skip
        return self

    @property
    def kind(self) -> Literal["embedded", "remote", "decisions", "pool"]:
        if self.pool is not None:
            return "pool"
        if self.decisions is not None:
            return "decisions"
        return "remote" if self.remote is not None else "embedded"


# --- upstreams ------------------------------------------------------------------------------------------------
class UpstreamSettings(Strict):
    """An OpenAI-compatible chat backend."""

    url: str = Field(description="Base URL including /v1, e.g. http://127.0.0.1:8001/v1")
    model: str | None = Field(None, description="Model name sent upstream; unset keeps the client's.")
    api_key_env: str | None = Field(None, description="Environment variable holding the upstream's key.")
    timeout_s: float = Field(600.0, gt=0, description="Read timeout: the longest gap between bytes.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Longest wait to connect; then the next upstream.")
    max_connections: int = Field(
        256, gt=0, description="Connections open to this upstream at once; its own pool, apart from the others'."
    )
    pool_timeout_s: float = Field(
        1.0, gt=0, description="Longest wait for a free connection of this upstream; then 503 with Retry-After."
    )
    forward_client_key: bool = Field(
        False,
        description="Send the caller's own credential (Authorization, x-api-key) to this upstream, for deployments "
        "where the upstream authenticates callers. Off: the caller's credential never leaves the router.",
    )
    tier: int = Field(
        0,
        description="This upstream's strength for policies with `session: {mode: escalate}`: higher is stronger. "
        "A session's later turn may move to an upstream of a higher tier, never to a lower or equal one.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_url(url).rstrip("/")

    @model_validator(mode="after")
    def _one_key(self) -> UpstreamSettings:
        if self.forward_client_key and self.api_key_env is not None:
            raise PydanticCustomError(
                "key", "set api_key_env (the router's key) or forward_client_key (the caller's), not both"
            )
        return self

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        return check_env(name)


# --- questions ------------------------------------------------------------------------------------------------
class ChoiceSpec(Strict):
    """A question with named options; `when` reads the pick and each option's probability."""

    type: Literal["choice"]
    instructions: str | None = Field(None, description="The question put to the engine.")
    criteria: dict[str, str | None] = Field(description="Option name -> description (or null), in order.")

    @field_validator("criteria", mode="before")
    @classmethod
    def _names(cls, criteria: Any) -> Any:
        if isinstance(criteria, dict):
            for name in criteria:
                if not isinstance(name, str) or not name.strip():
                    raise PydanticCustomError(
                        "option_name",
                        "option names must be non-empty strings, found {name}{hint}",
                        {"name": repr(name), "hint": "; quote it" if isinstance(name, bool | int | float) else ""},
                    )
            if len(criteria) < 2:
                raise PydanticCustomError(
                    "options", "a choice needs at least 2 options, found {n}", {"n": len(criteria)}
                )
        return criteria


class NoulCriteria(Strict):
    """What a yes and a no mean, for the engine."""

    true: str | None = Field(None, description="What yes means.")
    false: str | None = Field(None, description="What no means.")

    @model_validator(mode="before")
    @classmethod
    def _bool_keys(cls, data: Any) -> Any:
        # YAML reads the unquoted keys `true`/`false` as booleans.
        if isinstance(data, dict):
            return {str(k).lower() if isinstance(k, bool) else k: v for k, v in data.items()}
        return data


class NoulSpec(Strict):
    """A yes/no question; `when` reads P(yes)."""

    type: Literal["noul"]
    instructions: str | None = Field(None, description="The question put to the engine.")
    criteria: NoulCriteria | None = None


class ScoreSpec(Strict):
    """A question answered on ordered levels; `when` reads the expected level, 0-based."""

    type: Literal["score"]
    instructions: str | None = Field(None, description="The question put to the engine.")
    criteria: list[str] = Field(
        min_length=MIN_SCORE_LEVELS, max_length=MAX_SCORE_LEVELS, description="Level names, lowest first."
    )

    @field_validator("criteria")
    @classmethod
    def _levels(cls, levels: list[str]) -> list[str]:
        for level in levels:
            if not level.strip():
                raise PydanticCustomError("level", "score levels must be non-empty")
        duplicates = sorted({level for level in levels if levels.count(level) > 1})
        if duplicates:
            raise PydanticCustomError(
                "level", "score levels must be unique; repeated: {d}", {"d": ", ".join(map(repr, duplicates))}
            )
        return levels


QuestionSpec = Annotated[ChoiceSpec | NoulSpec | ScoreSpec, Field(discriminator="type")]


# --- rules ----------------------------------------------------------------------------------------------------
class BlockSpec(Strict):
    """An error answered in the API's own shape, before any upstream is called."""

    status: int = Field(403, ge=400, le=499, description="A 4xx status.")
    message: str = Field("Refused by policy.", min_length=1, description="The error's message.")


class EngineErrorBlockSpec(BlockSpec):
    """An error answered when the engine cannot decide."""

    status: int = Field(503, ge=400, le=599, description="A 4xx or 5xx status; 503 says the guard is unavailable.")


Tags = dict[str, str]
Params = dict[str, Any]


def _checked_tags(tags: Tags) -> Tags:
    """Tags are headers: a valid name, not one the router owns, no control character in the value."""
    for name, value in tags.items():
        if not HEADER_NAME.match(name):
            raise PydanticCustomError("header", "invalid header name {n}", {"n": repr(name)})
        lowered = name.lower()
        if lowered in _RESERVED_HEADERS or lowered.startswith("x-d3-"):
            raise PydanticCustomError(
                "header", "header {n} is reserved; pick another name, e.g. 'x-team'", {"n": repr(name)}
            )
        if any(ch in value for ch in "\r\n\0") or not value.isprintable():
            raise PydanticCustomError("header", "the value of header {n} holds a control character", {"n": repr(name)})
    return tags


class ActionSpec(Strict):
    """What a rule does: route (an upstream or a fallback list), block, and optionally tag and set."""

    route: str | list[str] | None = Field(None, description="An upstream name, or a list tried in order.")
    block: BlockSpec | None = Field(None, description="Refuse the request with this error instead of routing it.")
    tag: Tags = Field(default_factory=dict, description="Headers added upstream and to the response.")
    set_: Params = Field(default_factory=dict, alias="set", description="Request parameters to set.")

    @field_validator("route")
    @classmethod
    def _route(cls, route: str | list[str] | None) -> str | list[str] | None:
        if isinstance(route, list):
            if not route:
                raise PydanticCustomError("route", "a route list needs at least one upstream")
            if len(set(route)) != len(route):
                raise PydanticCustomError("route", "a route list names an upstream twice")
        return route

    @field_validator("tag")
    @classmethod
    def _tags(cls, tags: Tags) -> Tags:
        return _checked_tags(tags)

    @field_validator("set_")
    @classmethod
    def _params(cls, params: Params) -> Params:
        for name in params:
            if name in STRUCTURAL:
                raise PydanticCustomError(
                    "param",
                    "`set` cannot change {n}: `route` picks the model and the client owns the rest",
                    {"n": repr(name)},
                )
        return params

    @model_validator(mode="after")
    def _route_or_block(self) -> ActionSpec:
        if self.route is not None and self.block is not None:
            raise PydanticCustomError("action", "a rule either routes or blocks, not both")
        return self


class EngineErrorSpec(ActionSpec):
    """What a policy does when the engine cannot answer."""

    block: EngineErrorBlockSpec | None = Field(None, description="Refuse the request with this error instead.")


class RuleSpec(ActionSpec):
    """One rule; rules run in order, and the first that routes or blocks ends the walk."""

    name: str = Field(min_length=1, description="Unique in its policy; named in x-d3-rule, metrics and logs.")
    when: str | None = Field(
        None, description='A condition over the answers, e.g. kind == "code" and difficulty >= 1.5'
    )

    @field_validator("when", mode="before")
    @classmethod
    def _when(cls, when: Any) -> Any:
        if isinstance(when, bool | int | float):
            shown = str(when).lower() if isinstance(when, bool) else repr(when)
            raise PydanticCustomError("when", "`when` takes a condition as text, found {v}; quote it", {"v": shown})
        return when

    @model_validator(mode="after")
    def _does_something(self) -> RuleSpec:
        if self.route is None and self.block is None and not self.tag and not self.set_:
            raise PydanticCustomError(
                "action", "rule {n} does nothing; give it `route`, `block`, `tag` or `set`", {"n": repr(self.name)}
            )
        return self


class StateSpec(Strict):
    """What the engine reads of the request: the decision state."""

    from_: Literal["last_user", "new", "conversation", "json"] = Field(
        "last_user",
        alias="from",
        description="What the engine reads: the last user turn; what is new since the assistant last spoke (its tool "
        "calls, then the user's words and tool results after them: for agents); a transcript; or JSON.",
    )
    max_chars: int = Field(6000, gt=0, description="State budget; oldest text is cut first, and said so.")


class SessionSpec(Strict):
    """How a conversation's later turns are routed (the session is found by server.sessions)."""

    mode: Literal["sticky", "escalate", "off"] = Field(
        "sticky",
        description="`sticky`: later turns keep the upstreams the session's first routed turn chose. `escalate`: a "
        "later turn may move to an upstream of a higher `tier` (upstreams.NAME.tier, higher is stronger), never "
        "back. `off`: every turn is decided alone. Block rules are evaluated on every turn in every mode.",
    )
    ttl_s: float = Field(3600.0, gt=0, description="A session is forgotten this long after its last turn.")


class ExpectSpec(Strict):
    """What a test case checks; only the keys given are checked."""

    rule: str | None = Field(None, description="The rule that decides.")
    route: str | list[str] | None = Field(None, description="A name checks the first upstream, a list the whole list.")
    block: bool | int | None = Field(None, description="true or false, or the expected status.")
    tags: Tags | None = Field(None, description="Tags the decision adds (the ones given).")
    set_: Params | None = Field(None, alias="set", description="Parameters the decision sets (the ones given).")
    degraded: bool | None = Field(None, description="Whether on_engine_error decided.")


class TestCaseSpec(Strict):
    """A policy test case, run by `d3router test`: answers in, a decision expected."""

    name: str | None = Field(None, description="Shown beside the case's number in `d3router test`'s output.")
    answers: dict[str, Any] = Field(
        default_factory=dict,
        description="Per question: a number for a noul (P(yes)) or a score (expected level), an option name "
        "for a choice, or a mapping of probabilities.",
    )
    facts: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Per fact the rules read (e.g. `request.tokens: 150000`): its value for this case.",
    )
    engine_error: bool = Field(False, description="Test what happens when the engine fails.")
    expect: ExpectSpec = Field(description="What the decision must be.")


# --- answer guards (issue 27; compiled in policies/_answer.py) ----------------------------------------------
class AnswerBlockSpec(Strict):
    """The error the client gets instead of a blocked answer."""

    status: int = Field(403, ge=400, le=599, description="The HTTP status.")
    message: str = Field("The answer was withheld by policy.", description="The error's message.")


class AnswerRuleSpec(Strict):
    """One answer rule: `block` the answer, `replace` it with a text, or only `tag` it."""

    name: str = Field(min_length=1, description="Unique among the answer rules; named in x-d3-answer-rule and logs.")
    when: str | None = Field(None, description="A condition over the answer questions, e.g. leak > 0.8")
    block: AnswerBlockSpec | None = Field(None, description="Withhold the answer: the client gets this error.")
    replace: str | None = Field(
        None, min_length=1, description="Withhold the answer: the client gets an answer with this text instead."
    )
    tag: Tags = Field(default_factory=dict, description="Headers added to the client's response.")

    @field_validator("tag")
    @classmethod
    def _tags(cls, tags: Tags) -> Tags:
        return _checked_tags(tags)

    @model_validator(mode="after")
    def _one_action(self) -> AnswerRuleSpec:
        if self.block is not None and self.replace is not None:
            raise PydanticCustomError("action", "an answer rule either blocks or replaces, not both")
        if self.block is None and self.replace is None and not self.tag:
            raise PydanticCustomError(
                "action", "answer rule {n} does nothing; give it `block`, `replace` or `tag`", {"n": repr(self.name)}
            )
        return self


class AnswerSpec(Strict):
    """Questions and rules about the upstream's answer, judged before any of it reaches the client."""

    read: Literal["text", "tool_calls", "both"] = Field(
        "both",
        description="What the engine reads of the answer: its text, its tool calls (name and arguments), or both.",
    )
    context: bool = Field(True, description="Give the engine the request's own state beside the answer (the task).")
    max_chars: int = Field(6000, gt=0, description="The answer's budget in the state; the rest is cut, and said so.")
    max_answer_bytes: int = Field(
        1024 * 1024, gt=0, description="The largest answer held to be judged; a larger one is refused (502)."
    )
    window_chars: int = Field(
        1024, gt=0, description="Streams are judged in windows of this much new text, each released once judged."
    )
    overlap_chars: int = Field(
        256,
        ge=0,
        description="The end of the window before, judged again with the next: a marker split across "
        "the edge is read whole.",
    )
    on_engine_error: Literal["block", "pass"] = Field(
        "block", description="When the engine cannot judge the answer: withhold it (503) or let it pass."
    )
    questions: dict[str, QuestionSpec] = Field(
        default_factory=dict, max_length=MAX_QUESTIONS, description="Keyed by id, as a policy's questions."
    )
    rules: list[AnswerRuleSpec] = Field(min_length=1, description="In order; an answer no rule stops passes.")


class PolicySpec(Strict):
    """A policy, keyed by the model name clients send: questions for the engine, rules over the answers."""

    description: str | None = Field(None, description="Free text for whoever reads the file.")
    apis: list[ApiName] = Field(
        default_factory=lambda: list(APIS),
        json_schema_extra={"default": list(APIS)},
        min_length=1,
        description="The client APIs this policy decides; a request on another gets 404. "
        "Rules may `set` only parameters that every one of them takes.",
    )
    state: StateSpec = StateSpec()
    ask: Literal["together", "staged"] = Field(
        "together",
        description="`together`: one engine call with every question. `staged`: first the questions of the rules "
        "up to the first one that can route or block (the guard), the rest only when the walk has not ended there; "
        "same decisions, fewer questions for requests the guard decides.",
    )
    on_engine_error: EngineErrorSpec | None = Field(
        None, description="What to do when the engine fails; defaults to the policy's default route."
    )
    shadow: str | None = Field(
        None,
        description="Another policy evaluated on the same requests and answers but never acted on: /metrics counts "
        "where the two agree and the decision log records both. Promote it by editing and reloading.",
    )
    session: SessionSpec = Field(
        SessionSpec(), description="How a conversation's turns are routed: `sticky` (the default), `escalate`, `off`."
    )
    questions: dict[str, QuestionSpec] = Field(
        default_factory=dict,
        max_length=MAX_QUESTIONS,
        description="Keyed by question id (letters, digits, _), the name `when` uses. Only questions a rule reads "
        "are asked.",
    )
    rules: list[RuleSpec] = Field(
        min_length=1, description="In order; the last must be an unconditional route, the policy's default."
    )
    tests: list[TestCaseSpec] = Field(default_factory=list, description="Cases `d3router test` runs.")
    answer: AnswerSpec | None = Field(
        None, description="Questions and rules about the upstream's answer, judged before it reaches the client."
    )

    @field_validator("questions", mode="before")
    @classmethod
    def _ids(cls, questions: Any) -> Any:
        if isinstance(questions, dict):
            for name in questions:
                if not isinstance(name, str) or not _QUESTION_ID.match(name):
                    raise PydanticCustomError(
                        "question_id",
                        "question id {n} must be a name (letters, digits, _) so `when` can use it",
                        {"n": repr(name)},
                    )
                if name in SCOPES:
                    raise PydanticCustomError(
                        "question_id",
                        "question id {q} is reserved for facts (`{n}.NAME` in `when`); rename the question",
                        {"q": repr(name), "n": name},
                    )
        return questions


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
        description="Connections this process opens to Redis at most (each worker has its own pool). More calls at "
        "once wait for a free one, at most redis_timeout_s (then busy: answered in-process, Redis not taken for "
        "down). Larger is not faster: the event loop, not Redis, limits one process's calls (router/_store.py).",
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


class ConfigSpec(Strict):
    """A d3-router configuration file."""

    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    upstreams: dict[str, UpstreamSettings] = Field(
        min_length=1, description="The backends requests are routed to, keyed by the names rules `route` to."
    )
    policies: dict[str, PolicySpec] = Field(
        default_factory=dict, description="Keyed by the model name clients send (`auto`, `guarded`, ...)."
    )
