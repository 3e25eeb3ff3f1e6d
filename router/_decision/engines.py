"""The decision engine a configuration describes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from d3backend import (
    CachedEngine,
    DecisionEngine,
    DecisionsEngine,
    EmbeddedEngine,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    FailoverEngine,
    RemoteEngine,
    SharedCache,
)
from policies import DecisionsSettings, EngineSettings, RemoteSettings

Environ = Mapping[str, str]


def build_engine(
    settings: EngineSettings, *, base_dir: Path, environ: Environ, shared: SharedCache | None = None
) -> CachedEngine:
    """The engine the configuration describes, behind the decision cache (`cache.max_entries: 0` keeps no answers
    but still shares one engine call among identical decisions in flight), with `shared` as its second level.
    A pool's cache is in front of the whole pool (docs/engines.md#pools-across-kinds)."""
    engine: DecisionEngine
    if settings.pool is not None:
        engine = FailoverEngine(
            [(m.label, _remote_or_decisions(m.remote, m.decisions, environ)) for m in settings.pool],
            timeouts_s=[member.worst_s for member in settings.pool],
            set_aside_s=[member.set_aside_s for member in settings.pool],
        )
    elif settings.decisions is not None or settings.remote is not None:
        engine = _remote_or_decisions(settings.remote, settings.decisions, environ)
    else:
        embedded = settings.embedded
        model = embedded.model if embedded else "vllm-sr/d3-mini"
        if model.startswith(("./", "../")):  # a local model directory, relative to the configuration file
            model = str((base_dir / model).resolve())
        engine = EmbeddedEngine(
            model,
            served_model_name=embedded.served_model_name if embedded else None,
            max_model_len=embedded.max_model_len if embedded else None,
            dtype=embedded.dtype if embedded else "auto",
            kv_cache_memory_bytes=embedded.kv_cache_memory_bytes if embedded else None,
            extra_args=embedded.args if embedded else (),
            timeout_s=embedded.timeout_s if embedded else 30.0,
        )
    cache = settings.cache
    shared = shared if cache.max_entries else None  # no cache: no level of it, only single-flight
    return CachedEngine(engine, max_entries=cache.max_entries, ttl_s=cache.ttl_s, shared=shared)


def _remote_or_decisions(
    remote: RemoteSettings | None, decisions: DecisionsSettings | None, environ: Environ
) -> DecisionEngine:
    if decisions is not None:
        return DecisionsEngine(
            decisions.url, model=decisions.model, timeout_s=decisions.timeout_s,
            connect_timeout_s=decisions.connect_timeout_s,
            api_key=environ.get(decisions.api_key_env) if decisions.api_key_env else None,
        )  # fmt: skip
    if remote is None:
        raise ValueError("an engine needs `remote` or `decisions`")
    key = environ.get(remote.api_key_env) if remote.api_key_env else None
    return RemoteEngine(
        remote.urls, model=remote.model, timeout_s=remote.timeout_s, connect_timeout_s=remote.connect_timeout_s,
        api_key=key,
    )  # fmt: skip


async def start_engine(engine: DecisionEngine | None) -> None:
    """Start what needs starting: an embedded engine, behind the cache or not (a remote one is always ready)."""
    inner = engine.engine if isinstance(engine, CachedEngine) else engine
    if isinstance(inner, EmbeddedEngine):
        await inner.start()


def trouble(exc: EngineError) -> tuple[int, str]:
    """What a caller is told of an engine failure: a status and a sentence naming no engine URL, host or model
    (the details go to the operator's log; a caller learns nothing of the deployment)."""
    if isinstance(exc, EngineTimeout):
        return 504, "the decision engine did not answer in time"
    if isinstance(exc, EngineUnavailable):
        return 503, "cannot reach the decision engine"
    return 502, "the decision engine gave an answer that could not be read"
