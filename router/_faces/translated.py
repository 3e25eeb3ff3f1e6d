"""A route to an upstream of another API (`upstreams.NAME.api`): the request translated before it goes, the answer
back after, so that everything downstream of it (the relay, the answer guard, the session, the model's rename) sees
an answer in the client's own API (docs/translation.md).

    carried = carry(api, upstream, body, payload)     # None: the upstream speaks the client's API
    payload, path = carried.payload, carried.path     # the upstream's body and path
    response = await carried.answer(response)         # an httpx.Response whose body is the client's API's

What could not be carried is named in `x-d3-translation-losses` (the request's losses, and a whole answer's) and
counted in `d3router_translation_losses_total`; a streamed answer's own losses, known only at its end, are counted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from starlette.types import Scope

from d3backend import json_bytes
from policies import UpstreamSettings
from router._apis.chat import Api
from router._apis.registry import API_BY_NAME
from router._asgi.headers import HOP_BY_HOP_RAW, Headers
from router._asgi.relay import UpstreamBroke
from router._errors import BadRequest
from router._observe.metrics import Metrics
from router._translate.base import UNSIGNED, StreamTranslator, Translation
from router._translate.registry import translation

logger = logging.getLogger(__name__)

ANTHROPIC_VERSION = b"2023-06-01"  # the Messages API version a translated request asks for
LOSSES_HEADER = b"x-d3-translation-losses"
_DROPPED = HOP_BY_HOP_RAW | {b"content-length", b"content-encoding"}
_MAX_LOSS_LABELS = 64  # the metric's loss label values: the first ones seen, the rest counted as `other`


class Carried:
    """One request's translation: the upstream's payload and path, the headers it needs, its answer back."""

    def __init__(self, tr: Translation, payload: bytes, lost: list[str], metrics: Metrics) -> None:
        self.tr, self.payload, self.lost, self.metrics = tr, payload, lost, metrics
        self.path = tr.upstream_path
        self.upstream_api: Api = API_BY_NAME[tr.upstream]

    def headers(self, client_headers: Headers, upstream: UpstreamSettings) -> Headers:
        """Headers the upstream needs: the body unencoded (it is read and rewritten); Anthropic's version header for
        a Messages upstream when the client did not send one; with `forward_client_key`, the caller's key moved to
        the upstream API's own header (an `anthropic` client's `x-api-key` as chat's `Authorization: Bearer`)."""
        out: Headers = [(b"accept-encoding", b"identity")]
        if self.tr.upstream == "messages" and not any(k == b"anthropic-version" for k, _ in client_headers):
            out.append((b"anthropic-version", ANTHROPIC_VERSION))
        if upstream.forward_client_key:
            key = _client_key(client_headers)
            if key is not None:
                out += self.upstream_api.key_headers(key)  # the client's own are left out (`scope`)
        return out

    def scope(self, scope: Scope, upstream: UpstreamSettings) -> Scope:
        """The client's request as forwarded: without its query, which is its own API's (`?beta=true`), and with
        `forward_client_key`, without its key headers (`headers` sends the key in the upstream API's)."""
        if upstream.forward_client_key:
            kept = [(k, v) for k, v in scope["headers"] if k not in (b"x-api-key", b"authorization")]
            return {**scope, "query_string": b"", "headers": kept}
        return {**scope, "query_string": b""}

    def shown(self, extra: Sequence[str] = ()) -> Headers:
        """The losses header (when something was lost)."""
        names = [*self.lost, *(name for name in extra if name not in self.lost)]
        return [(LOSSES_HEADER, ",".join(names).encode())] if names else []

    def count(self, names: list[str]) -> None:
        seen = self.metrics.translation_loss_names
        for name in names:
            label = name if name in seen or len(seen) < _MAX_LOSS_LABELS else "other"
            seen.add(label)
            self.metrics.translation_losses[(self.tr.client, self.tr.upstream, label)] += 1

    async def answer(self, response: httpx.Response, upstream: str) -> tuple[httpx.Response, Headers]:
        """The upstream's response in the client's API, and the losses header to add to it. A JSON body (an answer
        or an error) is read whole and translated; an event stream is translated event by event as it flows."""
        self.count(self.lost)
        events = response.headers.get("content-type", "").startswith("text/event-stream")
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _DROPPED]
        if events and response.is_success:
            stream = self.tr.stream()
            return httpx.Response(response.status_code, headers=headers,
                                  stream=_Events(response, stream, self)), self.shown()  # fmt: skip
        try:
            raw = await response.aread()
        except httpx.HTTPError as exc:
            raise UpstreamBroke(f"upstream {upstream!r} broke off its response: {type(exc).__name__}") from exc
        finally:
            await response.aclose()
        more: list[str] = []
        if response.is_success:
            try:
                parsed = json.loads(raw)
                body, more = self.tr.answer(parsed if isinstance(parsed, dict) else {})
                raw = json_bytes(body)
            except ValueError:
                raw = self.tr.error(502, b"the upstream's answer is not JSON")
                response.status_code = 502
        else:
            raw = self.tr.error(response.status_code, raw)
        self.count(more)
        headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
        headers.append((b"content-type", b"application/json"))
        return httpx.Response(response.status_code, headers=headers, content=raw), self.shown(more)


class _Events(httpx.AsyncByteStream):
    """The upstream's event stream, translated as each chunk comes; the translator's end at the stream's end."""

    def __init__(self, response: httpx.Response, stream: StreamTranslator, carried: Carried) -> None:
        self.response, self.stream, self.carried = response, stream, carried

    async def __aiter__(self) -> AsyncIterator[bytes]:
        source: Any = self.response.stream
        async for chunk in source:
            out = self.stream.feed(chunk)
            if out:
                yield out
        tail = self.stream.flush()
        self.carried.count(self.stream.losses)
        if tail:
            yield tail

    async def aclose(self) -> None:
        await self.response.aclose()


def unsigned(api: Api, payload: bytes, metrics: Metrics) -> tuple[bytes, Headers]:
    """A Messages request to a Messages upstream without the thinking blocks the router made from another API's
    reasoning (their signature `UNSIGNED`): a session that moved from a chat upstream to an Anthropic one would
    otherwise send them, and Anthropic refuses a signature its model did not make. Named, as every loss."""
    if api.name != "messages" or _MARK not in payload:
        return payload, []
    body = json.loads(payload)
    for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            message["content"] = [block for block in content if not (isinstance(block, dict) and
                                  block.get("type") == "thinking" and block.get("signature") == UNSIGNED)]  # fmt: skip
    metrics.translation_losses[(api.name, api.name, "unsigned_thinking_dropped")] += 1
    return json_bytes(body), [(LOSSES_HEADER, b"unsigned_thinking_dropped")]


_MARK = UNSIGNED.encode()


def _client_key(headers: Headers) -> str | None:
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1")
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].decode("latin-1")
    return None


def native(api: Api, upstream: UpstreamSettings, payload: bytes) -> bool:
    """Whether `payload` goes to `upstream` as it is: the upstream speaks the client's API and the payload holds no
    thinking the router made (which `unsigned` takes out). Overlap speculates only on such a route."""
    return (upstream.api is None or upstream.api == api.name) and (api.name != "messages" or _MARK not in payload)


def carry(
    api: Api, upstream: UpstreamSettings, payload: bytes, body: dict[str, Any], raw: bytes,
    metrics: Metrics,
) -> Carried | None:  # fmt: skip
    """The translation of the client's request (`payload`, the rewritten body; `body` the parsed client body whose
    bytes are `raw`) to `upstream`'s API, or None when the upstream speaks the client's. `BadRequest` when no
    translation carries the client's API there (`d3router check` refuses such a route where the policy makes it
    certain)."""
    if upstream.api is None or upstream.api == api.name:
        return None
    tr = translation(api.name, upstream.api, {"custom_tools": upstream.custom_tools})
    if tr is None:
        raise BadRequest(f"this route's upstream speaks the {upstream.api!r} API and no translation carries a "
                         f"{api.name!r} request to it; set the policy's `apis` (docs/translation.md)")  # fmt: skip
    client_body = body if payload is raw else json.loads(payload)
    translated, lost = tr.request(client_body)
    return Carried(tr, json_bytes(translated), lost, metrics)
