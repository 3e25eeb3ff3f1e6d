"""One ASGI call made by hand, for tests that must see when each message of the answer goes out."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp


async def post_noting_the_end(app: ASGIApp, path: str, body: bytes, events: list[str]) -> None:
    """POST `body` (JSON) to `app` at `path`; "answered" joins `events` as the answer's last part is sent. The client
    stays connected until the answer is done."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "http_version": "1.1", "scheme": "http",
             "server": ("app", 80), "client": ("127.0.0.1", 1)}  # fmt: skip
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            events.append("answered")

    await app(scope, receive, send)  # type: ignore[arg-type]
