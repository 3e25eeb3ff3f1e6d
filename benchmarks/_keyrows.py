"""The router benchmark's client-key rows (issue 25): what keys and rate limits add to a cache hit.

    python -m benchmarks.router --no-engine --only "d3router auth" [--rounds 3] [--requests 3000]

Four rows, each the cache-hit row's proxy (benchmarks/_proxy.py `router --engine cache`, sessions off) with
`--auth` (and `--redis`), every one loaded with the same request carrying `Authorization: Bearer KEY`:

- `OFF`    auth off: no `server.auth`; the credential is hashed into an anonymous caller (router/_faces/auth.py)
- `KEYS`   keys on: `server.auth` with one key (the digest looked up, compared in constant time)
- `RATE`   keys on, the key's rate and its group's, in process (GCRA, two limits per request)
- `REDIS`  the same limits in the benchmark's own redis-server (one EVALSHA per request, both limits in one slot)

The limits are 10^9 requests a second: every request is counted and none refused. `vs_auth(rows)` gives a summary
line per comparison, each with the issue's target: keys on vs off, CPU per request added (<= 10 us); a rate limit
in process and in Redis vs keys on alone, p50 added at c=1 (<= 0.05 ms and <= 0.3 ms). The Redis row's line
says what one round trip of the limit's own script costs through the store's pipelined connection on the same
machine (and from redis-py, which the router used before), measured beside the rows (benchmarks/_redisfloor.py): the
floor under what that row can add. The keys' and the in-process limit's lines
add what the check costs measured alone (`own_costs`, microseconds), and the keys' line the CPU of a whole request
through the proxy app in process, keys on and off: two processes on two shared cores make the rows' differences
noisier (tens of microseconds from one run to the next) than those targets.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import yaml

KEY_ENV, KEY = "D3_BENCH_KEY", "sk-bench-not-a-secret-0123456789abcdef"
ENVIRON = {KEY_ENV: KEY}
HEADER = f"authorization: Bearer {KEY}"
OFF = "d3router auth off (cache hit, a credential sent)"
KEYS = "d3router auth keys (cache hit)"
RATE = "d3router auth keys, rate limit in-process (cache hit)"
REDIS = "d3router auth keys, rate limit in Redis (cache hit)"
# Row name: its `benchmarks._proxy` arguments ("redis": the benchmark's own server, benchmarks/_sessionrows.py).
ROWS = {
    OFF: ["--auth", "off"],
    KEYS: ["--auth", "keys"],
    RATE: ["--auth", "rate"],
    REDIS: ["--auth", "rate", "--redis", "redis"],
}
# (row, the row it is set against, the figure compared, the target): CPU per request in ms, or p50 at c=1 in ms.
COMPARED = [
    (KEYS, OFF, "CPU ms/req", 0.010),
    (RATE, KEYS, "p50 ms", 0.05),
    (REDIS, KEYS, "p50 ms", 0.3),
]
UNLIMITED = {"requests": 1_000_000_000, "window_s": 1}  # every request counted, none refused
UNUSED_BUDGET = {"tokens": 10**15, "period": "day"}  # a key's and its group's: read, added to, never used up
UNUSED_RATE = {"tokens": 10**15, "window_s": 60}


def spec(name: str) -> list[str]:
    return ["router", "--engine", "cache", *ROWS[name]]


def base(only: list[str], name: str) -> bool:
    """Whether `name` is a row another chosen key row is set against (`--only` picked that one)."""
    return any(name == against and any(part in row for part in only) for row, against, _, _ in COMPARED)


def headers(name: str) -> tuple[str, ...]:
    """The request headers the load generator sends to the row `name` (none for the other rows)."""
    return (HEADER,) if name in ROWS else ()


def with_auth(text: str, auth: str, redis: str | None = None, salt_env: str = "D3_BENCH_SALT") -> str:
    """The bench configuration `text` with `auth` (off, keys, rate) and `server.redis` (with the salt's variable,
    `salt_env`: Redis is refused without one)."""
    if auth not in ("off", "keys", "rate", "budget"):
        raise SystemExit(f"--auth: expected off, keys, rate or budget, found {auth!r}")
    if auth == "off" and redis is None:
        return text
    server: dict[str, Any] = {}
    if text.startswith("server: "):  # bench_config's one-line `server:` (sessions in Redis): merged into ours
        first, _, text = text.partition("\n")
        server = yaml.safe_load(first)["server"]
    if redis is not None:
        server["redis"] = redis
        server.setdefault("sessions", {})["salt_env"] = salt_env
    if auth != "off":
        key: dict[str, Any] = {"name": "bench", "key_env": KEY_ENV}
        server["auth"] = {"keys": [key]}
        if auth == "rate":
            key.update(group="bench", rate=UNLIMITED)
            server["auth"]["groups"] = {"bench": {"rate": UNLIMITED}}
        if auth == "budget":  # benchmarks/_usagerows.py: never used up, every answer's tokens counted
            limits = {"budget": UNUSED_BUDGET, "token_rate": UNUSED_RATE}
            key.update(group="bench", **limits)
            server["auth"]["groups"] = {"bench": limits}
    return f"server: {json.dumps(server)}\n{text}"


def own_costs(batches: int = 7, calls: int = 20_000) -> dict[str, float]:
    """What the checks themselves cost, in microseconds per request, measured in this process (the best of
    `batches` of `calls`): finding the caller from the request's headers with keys off (the credential hashed) and
    on (the key's digest looked up), and the two in-process rate limits (GCRA) of a key in a group. The rows'
    differences carry the noise of two processes on shared cores, far over these figures."""
    from benchmarks._proxy import bench_config  # (here: it imports the router app)
    from benchmarks.policy import batches_us
    from policies import parse_config
    from router._faces.auth import Access
    from router._faces.limits import Limiter

    raw = [tuple(part.strip().encode() for part in HEADER.split(":", 1))]
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), *raw, (b"content-length", b"99")]

    def best(call: Callable[[], object]) -> float:
        return round(min(batches_us(call, batches, calls)), 3)

    def access(auth: str) -> Access:
        config = parse_config(with_auth(bench_config("http://127.0.0.1:9/v1", "off"), auth), "bench.yaml")
        return Access(config, ENVIRON, b"salt")

    costs = {f"caller, auth {auth}": best(functools.partial(access(auth).caller, headers)) for auth in ("off", "keys")}
    caller, limiter = access("rate").caller(headers), Limiter()  # the rate row's key: its own limit and its group's
    if caller.rate is None or caller.group_rate is None:
        raise RuntimeError(f"the rate row's key has no rate and group rate: {caller}")
    costs["rate limit in process"] = best(lambda: _done(limiter.check(caller)))
    costs.update(asyncio.run(_requests(batches, max(1, calls // 10))))
    return costs


async def _requests(batches: int, calls: int) -> dict[str, float]:
    """The CPU of a whole decided request through the proxy app in this process (ASGI, no sockets; the engine a
    fake, the upstream a transport answering at once), auth off and keys on: the best of `batches` of `calls`, the
    two taken in turn. What keys add to a request, beyond finding the caller, shows here without the rows' noise."""
    from benchmarks._proxy import bench_config
    from d3backend import FakeEngine
    from policies import parse_config
    from router import create_app

    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hello"}]}).encode()
    raw = [tuple(part.strip().encode() for part in HEADER.split(":", 1))]
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *raw]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}  # fmt: skip
    answer = httpx.MockTransport(lambda _: httpx.Response(200, json={"object": "chat.completion", "choices": []}))

    async def one(app: Any) -> None:
        done, messages = asyncio.Event(), [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] != 200:
                raise RuntimeError(f"the in-process request was answered {message['status']}")
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await app(dict(scope), receive, send)

    apps = {}
    for auth in ("off", "keys"):
        text = with_auth(bench_config("http://upstream.test/v1", "off"), auth)
        apps[auth] = create_app(parse_config(text, "bench.yaml"), engine=FakeEngine(), transport=answer,
                                environ=ENVIRON)  # fmt: skip
    best = dict.fromkeys(apps, float("inf"))
    try:
        for _ in range(calls):  # warm: caches, the first request's imports
            for app in apps.values():
                await one(app)
        for _ in range(batches):
            for auth, app in apps.items():
                gc.collect()
                start = time.process_time()
                for _ in range(calls):
                    await one(app)
                best[auth] = min(best[auth], (time.process_time() - start) / calls * 1e6)
    finally:
        for app in apps.values():
            await app.aclose()
    return {f"request, auth {auth}": round(value, 1) for auth, value in best.items()}


def _done(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never waits (the in-process limiter's) to its end, without a loop's cost."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the in-process limiter waited")


def vs_auth(
    rows: list[dict[str, Any]], floor: dict[str, float] | None = None, costs: dict[str, float] | None = None
) -> dict[str, str]:
    """A line per comparison of `COMPARED` whose two rows were measured: the figure added at each concurrency, and
    against the target (at c=1 for p50; at every concurrency for CPU); the Redis row's with the `floor` measured
    beside it (benchmarks/_redisfloor.py: one round trip of the rate limit's own script, as the router makes it), the
    keys' and the in-process limit's with their `costs` measured alone (`own_costs`), against the same target."""
    by = {(row["target"], row["concurrency"]): row for row in rows}
    lines = {}
    for name, against, figure, target in COMPARED:
        added = [
            (level, row[figure] - by[(against, level)][figure])
            for (target_name, level), row in sorted(by.items(), key=lambda item: item[0][1])
            if target_name == name and (against, level) in by
            and isinstance(row.get(figure), float) and isinstance(by[(against, level)].get(figure), float)
        ]  # fmt: skip
        if not added:
            continue
        if figure == "p50 ms":
            at_1 = next((value for level, value in added if level == 1), None)
            verdict = "" if at_1 is None else f" ({'met' if at_1 <= target else 'MISSED'})"
            goal = f"target <= {target} ms at c=1{verdict}"
        else:
            verdict = "met" if all(value <= target for _, value in added) else "MISSED"
            goal = f"target <= {target * 1000:g} us ({verdict})"
        errors = sum(row["errors"] for (target_name, _), row in by.items() if target_name == name)
        below = ""
        if costs and name == KEYS:
            alone = costs["caller, auth keys"] - costs["caller, auth off"]
            whole = costs["request, auth keys"] - costs["request, auth off"]
            below = (f"; measured alone: the caller found in {costs['caller, auth keys']:.1f} us with keys on, "
                     f"{costs['caller, auth off']:.1f} us off: {alone:+.1f} us "
                     f"({'met' if alone <= target * 1000 else 'MISSED'}); a whole request in process, "
                     f"{costs['request, auth keys']:.1f} us of CPU with keys on, {costs['request, auth off']:.1f} "
                     f"us off: {whole:+.1f} us ({'met' if whole <= target * 1000 else 'MISSED'})")  # fmt: skip
        if costs and name == RATE:
            alone = costs["rate limit in process"]
            below = f"; measured alone: {alone:.1f} us a request ({'met' if alone <= target * 1000 else 'MISSED'})"
        if floor and name == REDIS:
            below = (f"; one round trip of its script at c=1: {floor['rate']:.3f} ms p50, "
                     f"{floor['rate_cpu']:.3f} ms CPU (from redis-py: {floor['rate_redis_py']:.3f} ms, "
                     f"{floor['rate_redis_py_cpu']:.3f} ms CPU; a GET's: {floor['get']:.3f} ms)")  # fmt: skip
        lines[f"keys: {name}"] = (
            f"{name}: adds {figure} {', '.join(f'{value:+.3f}' for _, value in added)} over {against} at "
            f"c={'/'.join(str(level) for level, _ in added)}; {goal}" + (f"; {errors} errors" if errors else "")
        ) + below
    return lines
