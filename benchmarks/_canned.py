"""A minimal ASGI server answering `/v1/systemone` with a fixed decision (and `/v1/models` with its model name):
isolates client cost from engine cost.

python -m benchmarks._canned PORT
"""

from __future__ import annotations

import json
import sys

import uvicorn
from starlette.types import Receive, Scope, Send

BODY = json.dumps({
    "id": "decision-canned", "object": "structured_decision", "created": 0, "model": "d3-tiny",
    "answers": {
        "kind": {"type": "choice", "choice": "code", "probabilities": {"code": 0.8, "math": 0.1, "chat": 0.1},
                 "confidence": 0.8},
        "jailbreak": {"type": "noul", "noul": 0.1, "probabilities": {"yes": 0.1, "no": 0.9}, "confidence": 0.9},
        "injection": {"type": "noul", "noul": 0.1, "probabilities": {"yes": 0.1, "no": 0.9}, "confidence": 0.9},
        "difficulty": {"type": "score", "score": 1.5,
                       "legend": {"0": "trivial", "1": "easy", "2": "hard", "3": "expert"},
                       "probabilities": {"0": 0.1, "1": 0.4, "2": 0.4, "3": 0.1}, "confidence": 0.4},
    },
    "usage": {"input_tokens": 100, "output_tokens": 0}, "joint": None,
}).encode()  # fmt: skip


MODELS = json.dumps({"object": "list", "data": [{"id": "d3-tiny", "object": "model"}]}).encode()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = MODELS if scope["path"] == "/v1/models" else BODY
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
