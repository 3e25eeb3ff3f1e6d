"""d3-router's decisions inside your own FastAPI app.

    pip install 'd3-router' fastapi uvicorn
    uvicorn examples.fastapi_app:app --port 8080

Chat requests for a model a policy names are decided before this handler runs: a block never reaches it, and a
route arrives with the decision at `request.state.d3`. Here the handler only reports the decision; a real app
would call the chosen upstream (or its own model) with it.
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Request

from router import D3Decision, D3RouterMiddleware

CONFIG = os.environ.get("D3ROUTER_CONFIG", os.path.join(os.path.dirname(__file__), "routing.yaml"))

app = FastAPI(title="my chat app")
app.add_middleware(D3RouterMiddleware, config=CONFIG)


@app.post("/v1/chat/completions")
async def chat(request: Request) -> dict[str, object]:
    body = await request.json()
    d3: D3Decision | None = getattr(request.state, "d3", None)
    if d3 is None:  # a model no policy names: not decided
        return {"model": body.get("model"), "decided": False}
    action = d3.decision.action
    upstreams = list(getattr(action, "upstreams", ()))
    return {"model": body.get("model"), "decided": True, "rule": d3.decision.rule, "upstreams": upstreams,
            "params": dict(d3.decision.params), "degraded": d3.decision.degraded}  # fmt: skip
