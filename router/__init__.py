"""d3-router's HTTP side: the reverse proxy, the Starlette middleware and the `d3router` command.

from router import create_app, D3RouterMiddleware
app = create_app(load_config("router.yaml"))            # the proxy, an ASGI app
app.add_middleware(D3RouterMiddleware, config="router.yaml")   # or decisions inside your own app
"""

from router._app import ProxyApp, create_app
from router._calibrate import CalibrationError, Threshold, curve, find_threshold, pick, write_threshold
from router._engines import build_engine
from router._middleware import D3RouterMiddleware
from router._replay import Label, Outcome, TrafficError, TrafficLine, read_traffic, replay
from router._report import markdown, summarize
from router._report_html import html_page
from router._service import D3Decision, RouterService, format_answers
from router._state import BadChatRequest, DecisionState, MediaRules, extract_state

__all__ = [
    "BadChatRequest",
    "CalibrationError",
    "D3Decision",
    "D3RouterMiddleware",
    "DecisionState",
    "Label",
    "MediaRules",
    "Outcome",
    "ProxyApp",
    "RouterService",
    "Threshold",
    "TrafficError",
    "TrafficLine",
    "build_engine",
    "create_app",
    "curve",
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
