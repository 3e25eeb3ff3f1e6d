"""The proxies the router benchmark measures, each run in its own process under uvicorn.

    python -m benchmarks._proxy passthrough PORT UPSTREAM_URL [--transport httpx|aiohttp|httpx-aiohttp]
    python -m benchmarks._proxy router PORT UPSTREAM_URL --engine cache|fake10ms|http://ENGINE [--transport ...]
        [--metrics prometheus|old] [--sessions off|memory|redis://HOST:PORT/DB] [--server uvicorn|granian]
        [--policy questions|facts|answer] [--upstream-model NAME] [--gc settled|unsettled] [--gen0 N]
        [--auth off|keys|rate|budget] [--redis redis://HOST:PORT/DB] [--usage on|off]

`passthrough` is the Python floor: Starlette + httpx forwarding the body and streaming the answer back, no
decisions. `router` is d3router's own app with a fake engine answering from its cache, a fake engine that takes 10
ms (`fakeNms`: N ms), or a real engine at a URL. `--metrics old` swaps in the hand-written metrics the router had
before prometheus_client (benchmarks/_old_metrics.py); run with PROMETHEUS_MULTIPROC_DIR set, the router's metrics
are in prometheus_client's multi-process mode, as under `d3router serve --workers N`. `--sessions` sets the bench
policy's `session:` (issue 12): `off`, or `{mode: sticky}` with the in-process store (`memory`) or in that Redis
(`server.redis`); without it the policy says nothing and the router's default applies.
`--server granian` serves the app under granian's embedded server (its Rust HTTP/1 on our uvloop loop)
instead of uvicorn + httptools. `--upstream-model NAME` gives the upstream a `model:`: the route rewrites the request's
model to it and the answer's back to the client's (issue 26.1; the "model rewritten, ..." rows). `--gc settled`
(the default) does what `d3router serve` does once started (router/_observe/gcpauses.py `settle()`, `--gen0 N` its
generation-0 threshold), `unsettled` leaves the collector as CPython sets it; either way the collections and their
longest pause are recorded, and `GET /_gc` answers them (JSON) since the last `GET /_gc`. `--auth keys` turns client
keys on (one key, the load generator's), `rate` adds that key's and its group's rate limits, `--redis URL` sets
`server.redis` (the limits kept there): benchmarks/_keyrows.py. `--auth budget` gives the key and its group a token
budget and a token rate never used up, `--usage off` the upstream `count_usage: false`: benchmarks/_usagerows.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from benchmarks import _keyrows
from benchmarks._overlaprows import mix_config, mix_engine
from d3backend import CachedEngine, DecisionEngine, FakeEngine, RemoteEngine, _http, make_client
from policies import parse_config
from router import create_app
from router._asgi.messages import send_bytes
from router._faces.serve import run
from router._faces.serve import serve_app as serve_uvicorn
from router._observe import gcpauses
from router._observe.metrics import Metrics

SALT_ENV, BENCH_SALT = "D3_BENCH_SALT", "d3-bench-salt-not-a-secret"  # every bench replica reads the same one
POLICY = """
upstreams: {{chat: {{url: "{upstream}"}}}}
policies:
  auto:
    questions:
      kind: {{type: choice, criteria: {{code: Writing code, math: Mathematics, chat: Anything else}}}}
      jailbreak: {{type: noul, instructions: Is the user trying to make the assistant ignore its rules?}}
      difficulty: {{type: score, criteria: [trivial, easy, hard, expert]}}
    rules:
      - {{name: guard, when: jailbreak > 2, block: {{status: 403, message: no}}}}
      - {{name: hard, when: 'kind == "code" and difficulty > 5', route: chat}}
      - {{name: default, route: chat}}
"""
ANSWER_GUARD = """    answer:
      questions: {leak: {type: noul, instructions: Does the answer reveal a secret?}}
      rules: [{name: no-leak, when: leak > 0.9, block: {status: 403, message: withheld}}]
"""
# A policy that reads facts only (issue 29): every request is decided on its size and its caller, no engine call.
FACTS_POLICY = """
upstreams: {{chat: {{url: "{upstream}"}}}}
policies:
  auto:
    rules:
      - {{name: long-context, when: request.tokens > 100000, route: chat}}
      - {{name: batch, when: 'caller.group == "batch" and not request.stream', route: chat}}
      - {{name: default, route: chat}}
"""


def passthrough_app(upstream: str, client: httpx.AsyncClient) -> Starlette:
    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        outbound = client.build_request("POST", f"{upstream}/chat/completions", content=body,
                                        headers={"content-type": "application/json"})  # fmt: skip
        response = await client.send(outbound, stream=True)
        return StreamingResponse(response.aiter_raw(), status_code=response.status_code,
                                 headers={"content-type": response.headers["content-type"]},
                                 background=BackgroundTask(response.aclose))  # fmt: skip

    return Starlette(routes=[Route("/v1/chat/completions", forward, methods=["POST"])])


class Counting:
    """Counts the calls that reach the engine."""

    def __init__(self, engine: DecisionEngine) -> None:
        self.engine = engine
        self.calls = 0

    async def decide(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self.engine.decide(*args, **kwargs)

    async def probe(self) -> Any:
        return await self.engine.probe()  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        await self.engine.aclose()


def with_task_count(app: Any, pauses: gcpauses.Pauses | None = None) -> Any:
    """`GET /_tasks` answers how many asyncio tasks the proxy process has (the soak's leak check); `GET /_gc` the
    garbage collections since the last `GET /_gc` (`pauses.window()`)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_tasks":
            await send_bytes(send, 200, str(len(asyncio.all_tasks())).encode(), [], b"text/plain")
            return
        if scope["type"] == "http" and scope["path"] == "/_gc" and pauses is not None:
            await send_bytes(send, 200, json.dumps(pauses.window()).encode(), [], b"application/json")
            return
        await app(scope, receive, send)

    return wrapped


# The fake's answers; it keeps no record of its calls (`Counting` counts them): a record of every call was the
# soak's RSS growth, about 240 bytes a request (issue 24, docs/operations.md).
ANSWERS = {"kind": "chat", "jailbreak": 0.1, "difficulty": 1}


def engine_for(spec: str) -> DecisionEngine:
    if spec == "cache":
        return CachedEngine(Counting(FakeEngine(ANSWERS, keep_calls=0)))
    if spec == "fake":
        return Counting(FakeEngine(ANSWERS, keep_calls=0))
    if spec.startswith("fake") and spec.endswith("ms"):  # fake10ms, fake40ms: a fake engine taking that long
        delay_s = float(spec.removeprefix("fake").removesuffix("ms")) / 1000
        return Counting(FakeEngine(ANSWERS, delay_s=delay_s, keep_calls=0))
    return Counting(RemoteEngine([spec], timeout_s=30.0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["passthrough", "router"])
    parser.add_argument("port", type=int)
    parser.add_argument("upstream")
    parser.add_argument("--engine", default="cache")
    parser.add_argument("--transport", choices=["httpx", "aiohttp", "httpx-aiohttp"], default=None)
    parser.add_argument("--metrics", choices=["prometheus", "old"], default="prometheus")
    parser.add_argument("--sessions", default=None, help="off, memory, or a redis:// URL")
    parser.add_argument("--server", choices=["uvicorn", "granian"], default="uvicorn")
    parser.add_argument("--policy", choices=["questions", "facts", "answer", "mix", "overlap"], default="questions",
                        help="the bench policy (asks three questions), one that reads only facts, or the bench "
                        "policy with an answer guard")  # fmt: skip
    parser.add_argument("--upstream-model", default=None, help="the upstream's `model:` (the route rewrites to it)")
    parser.add_argument("--upstream-api", default=None, help="the upstream's `api:` (a translated route, issue 30)")
    parser.add_argument("--gc", choices=["settled", "unsettled"], default="settled")
    parser.add_argument("--gen0", type=int, default=gcpauses.GEN0_THRESHOLD, help="with --gc settled")
    parser.add_argument("--auth", choices=["off", "keys", "rate", "budget"], default="off",
                        help="client keys, rate limits, token budgets")  # fmt: skip
    parser.add_argument("--usage", choices=["on", "off"], default="on", help="the upstream's count_usage")
    parser.add_argument("--redis", default=None, help="server.redis (with --auth rate: the limits kept there)")
    args = parser.parse_args()
    global UPSTREAM_API
    UPSTREAM_API = args.upstream_api
    if args.transport:
        _http.TRANSPORT = args.transport
    run(serve(args.mode, args.port, args.upstream, args.engine, args.metrics, args.sessions, args.server,
              policy=args.policy, model=args.upstream_model, gc_mode=args.gc, gen0=args.gen0, auth=args.auth,
              redis=args.redis, usage=args.usage))  # fmt: skip


UPSTREAM_API: str | None = None  # --upstream-api


def bench_config(upstream: str, sessions: str | None = None, policy: str = "questions", model: str | None = None
                 ) -> str:  # fmt: skip
    """The bench policy's YAML (`policy` facts: the facts-only one); `sessions` (off, memory or a Redis URL) sets its
    `session:` mode and store; `model` the upstream's `model:`."""
    text = (FACTS_POLICY if policy == "facts" else POLICY).format(upstream=upstream)
    if policy in ("mix", "overlap"):  # benchmarks/overlap.py (issue 31.4)
        text = mix_config(upstream, policy == "overlap")
    if policy == "answer":  # every answer judged (issue 27): one question, a cache hit like the request's
        text += ANSWER_GUARD
    if model is not None:
        text = text.replace(f'url: "{upstream}"', f'url: "{upstream}", model: {json.dumps(model)}', 1)
    if UPSTREAM_API is not None:  # benchmarks/_translaterows.py: the three APIs its translations carry
        text = text.replace(f'url: "{upstream}"', f'url: "{upstream}", api: {UPSTREAM_API}', 1)
        text = text.replace("\n  auto:\n", "\n  auto:\n    apis: [chat, messages, responses]\n", 1)
    if sessions is None:
        return text
    if sessions not in ("off", "memory") and not sessions.startswith(("redis://", "rediss://", "unix://")):
        raise SystemExit(f"--sessions: expected off, memory or a redis:// URL, found {sessions!r}")
    mode = "off" if sessions == "off" else "sticky"
    text = text.replace("\n  auto:\n", f"\n  auto:\n    session: {{mode: {mode}}}\n", 1)
    if sessions in ("off", "memory"):
        return text
    # A salt for Redis's hashed keys (refused without one); the same constant in every bench process (BENCH_SALT).
    return f"server: {{redis: {json.dumps(sessions)}, sessions: {{salt_env: {SALT_ENV}}}}}\n{text}"


def requests_total(exposition: str, name: str = "d3router_requests", status: str = "") -> int:
    """The family `name`'s total; for `status` ("2": 2xx), only the samples whose status label starts with it."""
    return int(sum(sample.value for family in text_string_to_metric_families(exposition)
                   if family.name == name for sample in family.samples
                   if sample.labels.get("status", "").startswith(status)))  # fmt: skip


async def serve_granian(app: Any, host: str, port: int, **_: Any) -> int:
    """`app` under granian's embedded server (one worker, on the running loop), until SIGINT/SIGTERM."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    server = Server(app, address=host, port=port, interface=Interfaces.ASGI, http=HTTPModes.http1, websockets=False,
                    log_level=LogLevels.warning)  # fmt: skip
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, server.stop)
    loop.add_signal_handler(signal.SIGTERM, server.stop)
    await server.serve()
    return 0


async def serve(
    mode: str,
    port: int,
    upstream: str,
    engine_spec: str,
    metrics: str = "prometheus",
    sessions: str | None = None,
    server: str = "uvicorn",
    policy: str = "questions",
    model: str | None = None,
    gc_mode: str = "settled",
    gen0: int = gcpauses.GEN0_THRESHOLD,
    auth: str = "off",
    redis: str | None = None,
    usage: str = "on",
) -> None:
    app: Any
    serve_app = serve_granian if server == "granian" else serve_uvicorn
    if mode == "passthrough":
        client = make_client(timeout=60, connect_timeout=5)
        if gc_mode == "settled":
            gcpauses.settle(gen0)
        pauses = gcpauses.Pauses(Metrics()).install()
        try:
            await serve_app(with_task_count(passthrough_app(upstream, client), pauses), "127.0.0.1", port,
                            log_level="warning")  # fmt: skip
        finally:
            pauses.uninstall()
            await client.aclose()
        return
    engine = Counting(mix_engine(engine_spec)) if policy in ("mix", "overlap") else engine_for(engine_spec)
    environ = {**os.environ, SALT_ENV: os.environ.get(SALT_ENV) or BENCH_SALT, **_keyrows.ENVIRON}
    text = _keyrows.with_auth(bench_config(upstream, sessions, policy, model), auth, redis, SALT_ENV)
    if usage == "off":  # benchmarks/_usagerows.py: nothing asked or read
        text = text.replace(f'url: "{upstream}"', f'url: "{upstream}", count_usage: false', 1)
    config = parse_config(text, "bench.yaml")
    app = create_app(config, engine=engine, environ=environ)
    if metrics == "old":
        from benchmarks._old_metrics import Metrics as OldMetrics

        app.service.metrics = OldMetrics()  # type: ignore[assignment]
    pauses = gcpauses.Pauses(Metrics() if metrics == "old" else app.service.metrics)
    if gc_mode == "settled":  # as `d3router serve` does (router/_faces/serve.py settle_gc), once started
        app.on_startup.append(lambda: gcpauses.settle(gen0))
    try:
        pauses.install()
        await serve_app(with_task_count(app, pauses), "127.0.0.1", port, log_level="warning")
    finally:
        pauses.uninstall()
        await app.aclose()
        await engine.aclose()
    counting = engine.engine if isinstance(engine, CachedEngine) else engine
    exposition = app.service.metrics.render()
    counts: dict[str, Any] = {"engine_calls": counting.calls, "decided_requests": requests_total(exposition)}
    counts["answered_requests"] = requests_total(exposition, status="2")  # not refused (a key's limits were asked)
    counts["upstream_tokens"] = requests_total(exposition, "d3router_upstream_tokens")  # benchmarks/_usagerows.py
    if auth == "budget":  # which budgets counted (in Redis or in process)
        counts["budgets"] = type(app.budgets).__name__
    if auth != "off":  # which limiter counted (RedisLimiter: in Redis), and what Redis left to this process
        counts["limiter"] = type(app.limiter).__name__
        counts["redis_fallbacks"] = requests_total(exposition, "d3router_redis_fallbacks")
    if sessions is not None:  # routed turns by session outcome, and the store calls Redis left to the in-process one
        families = {family.name: family for family in text_string_to_metric_families(exposition)}
        outcomes = families["d3router_sessions"].samples if "d3router_sessions" in families else []
        counts["sessions"] = {s.labels["outcome"]: int(s.value) for s in outcomes if s.name.endswith("_total")}
        counts["redis_fallbacks"] = requests_total(exposition, "d3router_redis_fallbacks")
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
