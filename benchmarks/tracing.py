"""What OpenTelemetry tracing costs the router (issue 14.4), off and on, side by side in one run on loopback.

    python -m benchmarks.tracing [--requests 3000] [--rounds 3] [--quick]

Targets: the upstream directly; d3router answering from its decision cache with tracing off (the default: the
hooks return one shared no-op object, opentelemetry is not even imported); and the same with tracing on, spans made
by the SDK and handed to a `BatchSpanProcessor` whose exporter drops them (what a production process pays on its
request path; the export itself runs on the processor's thread). Concurrency 1 and 8, the targets loaded in turns
(`--rounds`), pinned as in benchmarks/router.py (load generator and upstream on core 0, the proxy on core 1).
Also the cost of the hooks of one request with tracing off, timed in-process (ns).

    python -m benchmarks.tracing proxy PORT UPSTREAM_URL --tracing off|on     # one proxy, run by the above
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from benchmarks._harness import PY, Target, _pin, interleaved, load, process
from benchmarks._report import add_arguments, write
from d3backend import free_port

LEVELS = (1, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--requests", type=int, default=3000, help="per target and concurrency, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    requests = 60 if args.quick else args.requests
    rounds = 1 if args.quick else args.rounds
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    spans: dict[str, Any] = {}
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(up_port)], f"{upstream}/chat/completions"):
        with ExitStack() as stack:
            targets = [Target("direct", f"{upstream}/chat/completions")]
            for mode in ("off", "on"):
                targets.append(stack.enter_context(_proxy(mode, upstream, spans)))
            rows = interleaved(targets, LEVELS, requests, rounds)
    off = {row["concurrency"]: row for row in rows if row["target"] == "tracing off"}
    for row in rows:
        del row["_data"]
        base = off[row["concurrency"]]
        row["added p50 ms"] = row["p50 ms"] - base["p50 ms"] if row["target"] != "direct" else ""
        row["rps vs off"] = f"{row['rps'] / base['rps']:.1%}" if row["target"] != "direct" else ""
    columns = ["target", "concurrency", "requests", "errors", "rps", "rps vs off", "p50 ms", "p95 ms", "p99 ms",
               "added p50 ms", "CPU ms/req"]  # fmt: skip
    table = write("tracing", rows, columns, f"python -m benchmarks.tracing --rounds {rounds}", args.results)
    extra = {"hooks off, ns per request": hooks_off_ns(), "spans exported": spans}
    (args.results / "tracing-extra.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
    print(table)
    print(json.dumps(extra, indent=2))


@contextmanager
def _proxy(mode: str, upstream: str, spans: dict[str, Any]) -> Iterator[Target]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    argv = [*_pin(1), PY, "-m", "benchmarks.tracing", "proxy", str(port), upstream, "--tracing", mode]
    with process(argv, url) as proc:
        load(url, 8, 200)  # warm up
        yield Target(f"tracing {mode}", url, lambda: [proc.pid])
    for line in (proc.stdout.read() if proc.stdout else "").splitlines():  # printed as it stopped
        if line.startswith("{"):
            spans[f"tracing {mode}"] = json.loads(line)["spans"]


def hooks_off_ns(number: int = 200_000) -> float:
    """The hooks one decided request runs, with tracing off: the request, state, engine, rules and upstream
    spans, their attributes and the upstream headers."""
    from router._observe import tracing as _tracing

    scope = {"method": "POST", "path": "/v1/chat/completions", "headers": []}
    headers: list[tuple[bytes, bytes]] = []

    def one_request() -> None:
        with _tracing.request_span("chat", scope, None):
            with _tracing.span("d3.state"):
                pass
            with _tracing.engine_span() as engine:
                engine.set_attribute("d3.cache", "hit")
            with _tracing.span("d3.rules") as rules:
                rules.set_attribute("d3.rule", "default")
            with _tracing.upstream_span("chat", 0, "http://up") as attempt:
                _tracing.propagate_headers(headers)
                attempt.set_attribute("http.response.status_code", 200)

    assert not _tracing.ON
    best = min(timeit.repeat(one_request, number=number, repeat=5))
    return round(best / number * 1e9, 1)


# --- the proxy process ---------------------------------------------------------------------------------------------
def proxy_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.tracing proxy")
    parser.add_argument("port", type=int)
    parser.add_argument("upstream")
    parser.add_argument("--tracing", choices=["off", "on"], default="off")
    args = parser.parse_args(argv)
    from router._faces.serve import run

    run(_serve(args.port, args.upstream, args.tracing == "on"))


async def _serve(port: int, upstream: str, tracing: bool) -> None:
    from benchmarks._proxy import POLICY, engine_for
    from policies import parse_config
    from router import create_app, disable_tracing, enable_tracing
    from router._faces.serve import serve_app

    provider, exporter = None, None
    if tracing:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Dropping(SpanExporter):
            """Counts the spans and drops them: the request path's cost without a collector's."""

            spans = 0

            def export(self, spans: Sequence[Any]) -> SpanExportResult:
                Dropping.spans += len(spans)
                return SpanExportResult.SUCCESS

        exporter = Dropping()
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        enable_tracing(provider)
    engine = engine_for("cache")
    app = create_app(parse_config(POLICY.format(upstream=upstream), "bench.yaml"), engine=engine)
    try:
        await serve_app(app, "127.0.0.1", port, log_level="warning")
    finally:
        await app.aclose()
        await engine.aclose()
        if provider is not None:
            provider.shutdown()  # flushes: every span reaches the exporter
            disable_tracing()
    print(json.dumps({"spans": exporter.spans if exporter is not None else 0}), flush=True)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["proxy"]:
        proxy_main(sys.argv[2:])
    else:
        main()
