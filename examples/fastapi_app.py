"""d3-router's decisions inside your own FastAPI app.

    pip install 'd3-router' fastapi uvicorn
    uvicorn examples.fastapi_app:app --port 8080

Requests to the four generation paths (chat, completions, Responses, Messages) for a model a policy names are
decided before these handlers run: a block or a body the router cannot read never reaches them, and a route
arrives with the decision at `request.state.d3`. Here the handlers only report the decision; a real app would call
the chosen upstream (or its own model) with it. The body is read by FastAPI's own model, so whatever reaches a
handler undecided (a model no policy names) and is not a JSON object gets FastAPI's 422, never a 500.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import Body, FastAPI, Request

from router import D3Decision, D3RouterMiddleware

CONFIG = os.environ.get("D3ROUTER_CONFIG", os.path.join(os.path.dirname(__file__), "routing.yaml"))

app = FastAPI(title="my chat app")
app.add_middleware(D3RouterMiddleware, config=CONFIG)


def report(request: Request, body: dict[str, Any]) -> dict[str, object]:
    d3: D3Decision | None = getattr(request.state, "d3", None)
    if d3 is None:  # a model no policy names, and no server.default_policy: not decided
        return {"model": body.get("model"), "decided": False}
    action = d3.decision.action
    upstreams = list(getattr(action, "upstreams", ()))
    return {"model": body.get("model"), "decided": True, "rule": d3.decision.rule, "upstreams": upstreams,
            "params": dict(d3.decision.params), "degraded": d3.decision.degraded}  # fmt: skip


@app.post("/v1/chat/completions")
@app.post("/v1/completions")
@app.post("/v1/responses")
@app.post("/v1/messages")
async def generate(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, object]:  # noqa: B008
    return report(request, body)
