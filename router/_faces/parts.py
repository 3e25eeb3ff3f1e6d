"""What the proxy and the middleware both stand on, built once from a configuration.

service, sessions = build_parts(config, engine=None, environ=os.environ)
"""

from __future__ import annotations

from pathlib import Path

from d3backend import DecisionEngine
from policies import Config
from router._decision.engines import Environ, build_engine
from router._decision.service import RouterService
from router._observe.metrics import Metrics
from router._sessions.session import Sessions, session_salt
from router._sessions.store import build_store, shared_answers


def build_parts(config: Config, engine: DecisionEngine | None, environ: Environ) -> tuple[RouterService, Sessions]:
    """The service (its metrics, and the engine: `engine`, else the configuration's when `config.needs_engine`: a
    policy asks questions or `engine` names a kind) and the sessions. With `server.redis`, Redis holds the sessions
    and is the decision cache's second level (issue 12); else both stay in-process. The salt of the hashed keys is
    the same for both."""
    metrics = Metrics()
    store, salt = build_store(config.server, metrics), session_salt(config.server, environ)
    if engine is None and config.needs_engine:
        engine = build_engine(config.engine, base_dir=Path(config.file).parent, environ=environ,
                              shared=shared_answers(store, metrics, salt))  # fmt: skip
    return RouterService(config, engine, metrics=metrics), Sessions(store, config.server.sessions, salt, metrics)
