"""d3-router's HTTP side: the reverse proxy, the Starlette middleware and the `d3router` command.

from router import create_app, D3RouterMiddleware
app = create_app(load_config("router.yaml"))            # the proxy, an ASGI app
app.add_middleware(D3RouterMiddleware, config="router.yaml")   # or decisions inside your own app
"""

from router._anthropic import MESSAGES, Messages
from router._apis import CHAT, COMPLETIONS, RESPONSES, Api, Completions, Responses, extract_state
from router._app import ProxyApp, create_app
from router._calibrate import CalibrationError, Threshold, curve, find_threshold, pick, write_threshold
from router._endpoints import API_BY_NAME, API_BY_PATH, APIS, detect
from router._engines import build_engine
from router._middleware import D3RouterMiddleware
from router._replay import Label, Outcome, TrafficError, TrafficLine, read_traffic, replay
from router._report import markdown, summarize
from router._report_html import html_page
from router._service import D3Decision, RouterService, format_answers
from router._sessions import Sessions, SessionTurn
from router._state import BadChatRequest, BadRequest, DecisionState, MediaRules, Turn, build_state
from router._store import MemoryStore, RedisStore, Store, build_store
from router._tracing import disable_tracing, enable_tracing

__all__ = [
    "APIS",
    "API_BY_NAME",
    "API_BY_PATH",
    "CHAT",
    "COMPLETIONS",
    "MESSAGES",
    "RESPONSES",
    "Api",
    "BadChatRequest",
    "BadRequest",
    "CalibrationError",
    "Completions",
    "D3Decision",
    "D3RouterMiddleware",
    "DecisionState",
    "Label",
    "MediaRules",
    "MemoryStore",
    "Messages",
    "Outcome",
    "ProxyApp",
    "RedisStore",
    "Responses",
    "RouterService",
    "SessionTurn",
    "Sessions",
    "Store",
    "Threshold",
    "TrafficError",
    "TrafficLine",
    "Turn",
    "build_engine",
    "build_state",
    "build_store",
    "create_app",
    "curve",
    "detect",
    "disable_tracing",
    "enable_tracing",
    "extract_state",
    "find_threshold",
    "format_answers",
    "html_page",
    "markdown",
    "pick",
    "read_traffic",
    "replay",
    "summarize",
    "write_threshold",
]
