"""Decision engines behind one protocol: typed questions in, probabilities out.

    async with CachedEngine(RemoteEngine(["http://127.0.0.1:8000"])) as engine:
        decided = await engine.decide("Fix my SQL query", {"kind": Choice(None, {"code": None, "chat": None})})
        decided.answers["kind"].choice      # "code"

Engines: `RemoteEngine` (vLLM servers over HTTP), `EmbeddedEngine` (vLLM inside this process),
`CachedEngine` (a cache with single-flight in front of either), `FakeEngine` (a table, for tests).
"""

from d3backend._answers import answer_from
from d3backend._cache import CachedEngine, CacheStats, cache_key
from d3backend._embedded import EmbeddedEngine
from d3backend._errors import (
    EngineBadAnswer,
    EngineBadResponse,
    EngineError,
    EngineRejected,
    EngineTimeout,
    EngineUnavailable,
)
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
from d3backend._wire import JSONValue, json_bytes

__all__ = [
    "D3_MAX_OPTIONS",
    "ENGINE_HEADERS",
    "GENERATIVE_MAX_OPTIONS",
    "MAX_QUESTIONS",
    "MAX_SCORE_LEVELS",
    "MIN_SCORE_LEVELS",
    "Answer",
    "CacheStats",
    "CachedEngine",
    "Choice",
    "ChoiceAnswer",
    "Decided",
    "DecisionEngine",
    "EmbeddedEngine",
    "EngineBadAnswer",
    "EngineBadResponse",
    "EngineError",
    "EngineRejected",
    "EngineTimeout",
    "EngineUnavailable",
    "FakeEngine",
    "JSONValue",
    "Noul",
    "NoulAnswer",
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
    "cache_key",
    "decode_decided",
    "encode_decided",
    "free_port",
    "json_bytes",
    "make_client",
    "make_model",
    "make_transport",
    "outbound_request",
    "redact_url",
]
