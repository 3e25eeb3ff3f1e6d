"""d3-router's HTTP side: the reverse proxy, the Starlette middleware and the `d3router` command.

from router import create_app, D3RouterMiddleware
app = create_app(load_config("router.yaml"))            # the proxy, an ASGI app
app.add_middleware(D3RouterMiddleware, config="router.yaml")   # or decisions inside your own app
"""

from router._apis.chat import CHAT, Api, extract_state
from router._apis.completions import COMPLETIONS, Completions
from router._apis.messages import MESSAGES, Messages
from router._apis.registry import API_BY_NAME, API_BY_PATH, APIS, detect
from router._apis.responses import RESPONSES, Responses
from router._apis.state import BadChatRequest, DecisionState, MediaRules, Turn, build_state
from router._decision.engines import build_engine
from router._decision.record import D3Decision, format_answers
from router._decision.service import RouterService
from router._errors import BadRequest
from router._faces.middleware import D3RouterMiddleware
from router._faces.proxy import ProxyApp, create_app
from router._observe.tracing import disable_tracing, enable_tracing
from router._offline.calibrate import CalibrationError, Threshold, curve, find_threshold, pick, write_threshold
from router._offline.replay import Label, Outcome, TrafficError, TrafficLine, read_traffic, replay
from router._offline.report import markdown, summarize
from router._offline.report_html import html_page
from router._sessions.session import Sessions, SessionTurn
from router._sessions.store import MemoryStore, RedisStore, Store, build_store

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
