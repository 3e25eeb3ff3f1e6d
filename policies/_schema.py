"""The configuration file's schema: pydantic models at the trust boundary, strict about unknown keys.

These models check the file's shape and types; `_load.py` then checks what crosses sections (route names,
`when` conditions, engine limits, test cases) and compiles policies. `d3router schema` prints their JSON Schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from d3backend import D3_MAX_OPTIONS, MAX_QUESTIONS
from policies._answer_spec import (
    AnswerBlockSpec,
    AnswerExpectSpec,
    AnswerRuleSpec,
    AnswerSpec,
    AnswerTestSpec,
)
from policies._facts import SCOPES
from policies._params import APIS, ApiName
from policies._server import DecisionLogSettings, ServerSettings, SessionServerSettings
from policies._specs import (
    _QUESTION_ID,
    ActionSpec,
    BlockSpec,
    ChoiceSpec,
    EngineErrorBlockSpec,
    EngineErrorSpec,
    ExpectSpec,
    NoulCriteria,
    NoulSpec,
    OverlapSpec,
    QuestionSpec,
    RuleSpec,
    ScoreSpec,
    SessionSpec,
    StateSpec,
    Tags,
    TestCaseSpec,
)
from policies._strict import Strict, check_env, check_url

__all__ = [  # the schema's models, wherever they are written (policies/_specs.py, _answer_spec.py, _server.py)
    "ActionSpec", "AnswerBlockSpec", "AnswerExpectSpec", "AnswerRuleSpec", "AnswerSpec", "AnswerTestSpec",
    "BlockSpec", "CacheSettings", "ChoiceSpec", "ConfigSpec", "DecisionLogSettings", "DecisionsSettings",
    "EmbeddedSettings", "EngineErrorBlockSpec", "EngineErrorSpec", "EngineSettings", "ExpectSpec", "NoulCriteria",
    "NoulSpec", "OverlapSpec", "PolicySpec", "QuestionSpec", "RemoteSettings", "RuleSpec", "ScoreSpec",
    "ServerSettings", "SessionServerSettings", "SessionSpec", "StateSpec", "Tags", "TestCaseSpec", "UpstreamSettings",
]  # fmt: skip


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

    @model_validator(mode="before")
    @classmethod
    def _not_embedded(cls, data: Any) -> Any:
        # An in-process engine is not a pool's (issue 28): the pool neither starts nor stops it, and a failover to
        # the process's own vLLM is no failover when the process is what fails. Said plainly, not "extra input".
        if isinstance(data, dict) and "embedded" in data:
            raise PydanticCustomError(
                "pool_embedded",
                "an embedded engine cannot be one of engine.pool's engines; serve the model with vLLM "
                "(`vllm serve MODEL`) and name it here as `remote: {urls: [...]}`, or use `engine.embedded` "
                "alone, without a pool",
            )
        return data

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
class PriceSpec(Strict):
    """What an upstream's tokens cost, per million, in one currency of your choice (the router never converts)."""

    input: float = Field(ge=0, description="Per million input tokens not read from the prompt cache.")
    cached_input: float | None = Field(
        None, ge=0, description="Per million input tokens read from the prompt cache; unset: `input`'s price."
    )
    output: float = Field(ge=0, description="Per million output tokens.")


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
    price: PriceSpec | None = Field(
        None,
        description="Its tokens' prices (issue 29.3): each answer's cost in the decision log and metrics; "
        "`d3router replay` shows cost and saving. Unset: answers are counted in tokens only.",
    )
    count_usage: bool = Field(
        True,
        description="Read the tokens of each answer (its usage); a streamed chat or completions request that does not "
        "ask for the usage chunk (`stream_options.include_usage`) is sent asking for it, and the chunk is cut out "
        "before the client. Off: nothing is asked or read (budgets and token limits then count nothing from it).",
    )
    api: ApiName | None = Field(
        None,
        description="The API this upstream speaks (chat, completions, responses, messages). Unset: the client's own "
        "(no translation). Set: a request of another API is translated to it and its answers back, what cannot be "
        "carried named in x-d3-translation-losses (docs/translation.md).",
    )
    custom_tools: Literal["function", "native"] = Field(
        "function",
        description="How a Responses request's custom tools (Codex's `apply_patch`) reach this upstream when it "
        "speaks chat: `function`, as function tools taking the input as one string (what vLLM and most chat servers "
        "take), their calls back as custom tool calls; `native`, as chat's own custom tools (OpenAI's chat API).",
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
    overlap: OverlapSpec | None = Field(
        None,
        description="Start the upstream request while the engine decides, on the route the decision is expected to "
        "take (docs/overlap.md); a block or another route cancels it. Unset: the decision comes first.",
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
