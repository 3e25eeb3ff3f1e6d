"""OpenTelemetry traces (issue 14.4): a span per decided request, its parts as children, W3C `traceparent` sent to
the engine and the upstream. Needs the `otel` extra (`pip install 'd3-router[otel]'`); off unless configured.

    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 OTEL_SERVICE_NAME=d3-router d3router serve router.yaml

`d3router serve` traces when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`; `none` for none) or an
OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); `OTEL_SDK_DISABLED=true`
turns it off. The other `OTEL_*` variables are the SDK's: `OTEL_SERVICE_NAME` (default `d3-router`),
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, or `grpc` with the gRPC exporter
installed), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, `OTEL_PROPAGATORS`. An application
that mounts the middleware, or sets up its own provider, calls `enable_tracing()` (the global provider) instead.

The tree of one request:

    POST /v1/chat/completions        SERVER  d3.api, d3.policy, d3.rule, d3.action, d3.upstream, d3.cache,
    ├── d3.state                             d3.degraded, d3.request_id, http.response.status_code
    ├── d3.engine                    CLIENT  d3.cache (hit|miss); traceparent sent to the engine
    ├── d3.rules                             d3.rule, d3.action
    └── d3.upstream (each attempt)   CLIENT  d3.upstream, d3.attempt, server.address, http.response.status_code
        └── d3.answer (each judgement)       d3.policy, d3.answer.rule, d3.answer.outcome, d3.answer.window (a
            └── d3.engine                    stream's), d3.cache, d3.degraded: an answer guard's (issue 27)

Attributes never hold a prompt, a body or a key; an exception is recorded by its type only (`error.type`), as
its message may quote the request. Off, each hook costs a call returning one shared no-op object; the hot path
reads the module flag `ON` (measured: benchmarks/tracing.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from starlette.types import Scope

from d3backend import ENGINE_HEADERS
from router._asgi.headers import Headers
from router._observe.logs import RequestInfo

logger = logging.getLogger(__name__)

ON = False  # the one flag the hot path reads
_tracer: Any = None  # an opentelemetry Tracer while ON
_provider: Any = None  # the SDK provider `configure` made: flushed and shut down by `shutdown`
_PROPAGATED = frozenset({b"traceparent", b"tracestate"})


class NoSpan:
    """What a hook returns while tracing is off: a context manager and a span that do nothing."""

    __slots__ = ()

    def __enter__(self) -> NoSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None


NO_SPAN = NoSpan()


class Span:
    """A span made current for its `with` block (and, for an engine call, its `traceparent` handed to d3backend);
    ended on exit, with `error.type` and an error status if an exception leaves the block."""

    __slots__ = ("_engine", "_engine_token", "_span", "_token")

    def __init__(self, span: Any, *, engine: bool = False) -> None:
        self._span, self._engine = span, engine

    def __enter__(self) -> Span:
        from opentelemetry import context, propagate, trace

        ctx = trace.set_span_in_context(self._span)
        self._token = context.attach(ctx)
        if self._engine:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=ctx)
            self._engine_token = ENGINE_HEADERS.set(tuple(carrier.items()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if exc_type is not None:
            self._span.set_attribute("error.type", exc_type.__qualname__)
            self._span.set_status(Status(StatusCode.ERROR))  # no description: an exception's text may quote a body
        if self._engine:
            ENGINE_HEADERS.reset(self._engine_token)
        context.detach(self._token)
        self._span.end()

    def set_attribute(self, key: str, value: Any) -> None:
        self._span.set_attribute(key, value)


def span(name: str) -> Span | NoSpan:
    """An internal span, child of the current one: `with span("d3.state"): ...`."""
    if not ON:
        return NO_SPAN
    return Span(_tracer.start_span(name))


def engine_span() -> Span | NoSpan:
    """The engine call's span; the engine's requests made inside it carry its `traceparent`."""
    if not ON:
        return NO_SPAN
    from opentelemetry.trace import SpanKind

    return Span(_tracer.start_span("d3.engine", kind=SpanKind.CLIENT), engine=True)


def upstream_span(name: str, attempt: int, url: str) -> Span | NoSpan:
    """One upstream attempt, from sending the request to the end of relaying its response."""
    if not ON:
        return NO_SPAN
    from urllib.parse import urlsplit

    from opentelemetry.trace import SpanKind

    attributes = {"d3.upstream": name, "d3.attempt": attempt, "server.address": urlsplit(url).hostname or ""}
    return Span(_tracer.start_span("d3.upstream", kind=SpanKind.CLIENT, attributes=attributes))


def request_span(api: str, scope: Scope, info: RequestInfo | None) -> Span | NoSpan:
    """The span of one decided request; it continues the client's trace when the request carries one. Its
    attributes are set when it ends, from what `info` learned meanwhile."""
    if not ON:
        return NO_SPAN
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _PROPAGATED}
    parent = propagate.extract(carrier) if carrier else None
    attributes = {"http.request.method": scope["method"], "http.route": scope["path"], "d3.api": api}
    raw = _tracer.start_span(f"{scope['method']} {scope['path']}", context=parent, kind=SpanKind.SERVER,
                             attributes=attributes)  # fmt: skip
    return _RequestSpan(raw, info)


class _RequestSpan(Span):
    __slots__ = ("_info",)

    def __init__(self, span: Any, info: RequestInfo | None) -> None:
        super().__init__(span)
        self._info = info

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        info = self._info
        if info is not None:
            found = {"d3.request_id": info.id, "d3.policy": info.policy, "d3.rule": info.rule,
                     "d3.action": info.action, "d3.upstream": info.upstream, "d3.cache": info.cache,
                     "http.response.status_code": info.status or None}  # fmt: skip
            self._span.set_attributes({key: value for key, value in found.items() if value is not None})
            self._span.set_attribute("d3.degraded", info.degraded)
            if info.status >= 500:
                from opentelemetry.trace import Status, StatusCode

                self._span.set_attribute("error.type", str(info.status))
                self._span.set_status(Status(StatusCode.ERROR))
        super().__exit__(exc_type, exc, tb)


def propagate_headers(headers: Headers) -> Headers:
    """`headers` for an upstream request made in the current span: the client's `traceparent`/`tracestate`
    replaced by the span's (the upstream's spans are its children)."""
    if not ON:
        return headers
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return headers
    drop = {key.encode("latin-1") for key in carrier} | _PROPAGATED
    kept = [(k, v) for k, v in headers if k.lower() not in drop]
    return kept + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]


# --- switching it on -------------------------------------------------------------------------------------------------
def enable_tracing(provider: Any = None) -> None:
    """Trace with `provider` (an opentelemetry `TracerProvider`), or the global one; for an application that sets
    up OpenTelemetry itself (the middleware, tests with an in-memory exporter). `disable_tracing()` undoes it."""
    global ON, _tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise RuntimeError("tracing needs the otel extra: pip install 'd3-router[otel]'") from exc
    _tracer = (provider or trace.get_tracer_provider()).get_tracer("d3router")
    ON = True


def disable_tracing() -> None:
    global ON, _tracer
    ON, _tracer = False, None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the `OTEL_*` variables ask for traces: an exporter named (not `none`) or an OTLP endpoint set."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Set up tracing from the `OTEL_*` variables (see the module's docstring) if they ask for it; True if on. The
    exporters read their own variables from the process environment."""
    global _provider
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("OTEL_* variables ask for traces, but the otel extra is not installed: "
                       "pip install 'd3-router[otel]'; tracing stays off")  # fmt: skip
        return False
    named = "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "") or environ.get("OTEL_SERVICE_NAME")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "d3-router"}))
    names = _names(environ)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    trace.set_tracer_provider(provider)
    _provider = provider
    enable_tracing(provider)
    logger.info("tracing on: exporting spans to %s", ", ".join(names))
    return True


def check(environ: Mapping[str, str] | None = None) -> None:
    """Raise the `ValueError` `configure` would, without starting anything (`serve --workers`: before the workers
    start, each of which then configures its own)."""
    environ = os.environ if environ is None else environ
    if wanted(environ):
        try:
            import opentelemetry.sdk  # noqa: F401
        except ImportError:
            return  # configure() logs it and traces nothing
        for name in _names(environ):
            _exporter(name, environ).shutdown()


def _names(environ: Mapping[str, str]) -> list[str]:
    return [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER names {name!r}; d3router knows otlp, console and none")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if (protocol or "http/protobuf") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ValueError("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                             "installed; or use http/protobuf") from None  # fmt: skip
        return OTLPSpanExporter()
    if protocol not in (None, "http/protobuf"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL is {protocol!r}; expected http/protobuf or grpc")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


def shutdown() -> None:
    """Flush and stop what `configure` started (at the end of `d3router serve`)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None
    disable_tracing()
