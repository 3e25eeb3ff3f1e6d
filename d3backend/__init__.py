"""Decision engines behind one protocol: typed questions in, probabilities out.

    async with CachedEngine(RemoteEngine(["http://127.0.0.1:8000"])) as engine:
        decided = await engine.decide("Fix my SQL query", {"kind": Choice(None, {"code": None, "chat": None})})
        decided.answers["kind"].choice      # "code"

Engines: `RemoteEngine` (vLLM servers over HTTP), `EmbeddedEngine` (vLLM inside this process),
`DecisionsEngine` (any decision model behind the OpenAI Decisions API),
`FailoverEngine` (engines of any kind tried in order),
`CachedEngine` (a cache with single-flight in front of either), `FakeEngine` (a table, for tests).
"""

from d3backend._answers import answer_from
from d3backend._cache import CachedEngine, CacheStats, cache_key
from d3backend._decisions import PROMPT_CACHE_KEY, DecisionsEngine
from d3backend._decisions_wire import answer_item, decision_input, decisions_request, parse_decision, usage_json
from d3backend._embedded import EmbeddedEngine
from d3backend._errors import (
    EngineBadAnswer,
    EngineBadResponse,
    EngineError,
    EngineRateLimited,
    EngineRefused,
    EngineRejected,
    EngineTimeout,
    EngineUnavailable,
)
from d3backend._failover import POOL_MODEL, FailoverEngine, PoolStats
from d3backend._fake import FakeEngine
from d3backend._http import make_client, make_transport, outbound_request
from d3backend._protocol import DecisionEngine
from d3backend._remote import ENGINE_HEADERS, RemoteEngine, UrlStats, redact_url
from d3backend._server import ServerError, VllmServer, free_port
from d3backend._shared import SharedCache, decode_decided, encode_decided
from d3backend._tinymodel import make_model
from d3backend._types import (
    D3_MAX_OPTIONS,
    GENERATIVE_MAX_OPTIONS,
    MAX_QUESTIONS,
    MAX_SCORE_LEVELS,
    MIN_SCORE_LEVELS,
    Answer,
    Choice,
    ChoiceAnswer,
    Decided,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    Usage,
)
from d3backend._wire import JSONValue, answer_wire, json_bytes

__all__ = [
    "D3_MAX_OPTIONS",
    "ENGINE_HEADERS",
    "GENERATIVE_MAX_OPTIONS",
    "MAX_QUESTIONS",
    "MAX_SCORE_LEVELS",
    "MIN_SCORE_LEVELS",
    "POOL_MODEL",
    "PROMPT_CACHE_KEY",
    "Answer",
    "CacheStats",
    "CachedEngine",
    "Choice",
    "ChoiceAnswer",
    "Decided",
    "DecisionEngine",
    "DecisionsEngine",
    "EmbeddedEngine",
    "EngineBadAnswer",
    "EngineBadResponse",
    "EngineError",
    "EngineRateLimited",
    "EngineRefused",
    "EngineRejected",
    "EngineTimeout",
    "EngineUnavailable",
    "FailoverEngine",
    "FakeEngine",
    "JSONValue",
    "Noul",
    "NoulAnswer",
    "PoolStats",
    "Question",
    "RemoteEngine",
    "Score",
    "ScoreAnswer",
    "ServerError",
    "SharedCache",
    "UrlStats",
    "Usage",
    "VllmServer",
    "answer_from",
    "answer_item",
    "answer_wire",
    "cache_key",
    "decision_input",
    "decisions_request",
    "decode_decided",
    "encode_decided",
    "free_port",
    "json_bytes",
    "make_client",
    "make_model",
    "make_transport",
    "outbound_request",
    "parse_decision",
    "redact_url",
    "usage_json",
]
