"""The router benchmark's overlap rows (issue 31.4): time to first byte the router adds with and without overlap,
side by side in one run, on the four client APIs, plain and streamed. A row family (benchmarks/_families.py):

    python -m benchmarks.router --no-engine --only overlap            # or --only "overlap, Chat" for one API

An upstream of the family's own whose every answer waits `FIRST_MS` (a model's time to first token:
benchmarks/_upstream.py `--first-ms`), and two d3router processes with a fake engine taking `ENGINE_MS` a decision,
no cache, on the overlap benchmark's policy (benchmarks/_overlaprows.py): `no overlap` (`--policy mix`: the decision,
then the upstream) and `overlap` (`--policy overlap`, `overlap: {when: always}`: the upstream request starts on the
default route while the engine decides). Every request is the load generator's one user turn, which the policy
routes to its default route: the speculation always agrees. For each API (chat, completions, Responses, Messages)
three targets, loaded in turns at each concurrency up to 8: the upstream directly and each router. Columns:
"first byte added p50 ms" (the router's first byte p50 less the upstream's own, same API, same concurrency) and, on
the overlap row, "added vs no overlap" (its added first byte over the no-overlap router's). A summary line per API
and mode; router-extra.json's `overlap speculations` has each router's speculation counters from its /metrics.
The routers have core 1, the upstream and the load generator core 0 (as benchmarks/overlap.py, which also measures
a mix with blocked and rerouted requests and the wasted upstream work).
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from typing import Any

from benchmarks._apirows import picked
from benchmarks._families import Run
from benchmarks._harness import PY, Target, _pin, interleaved, load, process
from benchmarks.overlap import APIS, body, speculations
from d3backend import free_port

NAME = "overlap"
COLUMNS = ["first byte added p50 ms", "added vs no overlap"]
ENGINE_MS, FIRST_MS = 40, 300  # the figures: a decision of 40 ms, an upstream's first token after 300 ms
DIRECT, NONE, OVERLAP = "upstream direct", "d3router, no overlap", "d3router, overlap"
POLICIES = {NONE: "mix", OVERLAP: "overlap"}  # benchmarks/_proxy.py `--policy`
# The APIs as row names spell them: capitalised, as the translation rows', so that `--only messages` (the cache-hit
# rows of an API) does not pick these too.
TITLES = {"chat": "Chat", "responses": "Responses", "messages": "Messages", "completions": "Completions"}
APIS_BY_TITLE = {title: api for api, title in TITLES.items()}


def row(api: str, target: str, stream: bool = False) -> str:
    """A row's name: `overlap, API: TARGET`, streamed ones with the "stream, " prefix."""
    return f"{'stream, ' * stream}overlap, {TITLES[api]}: {target}"


def _chosen(only: list[str]) -> list[str]:
    return [api for api in APIS if any(picked(only, row(api, target, stream)) for target in (DIRECT, *POLICIES)
                                       for stream in (False, True))]  # fmt: skip


def rows(run: Run) -> list[dict[str, Any]]:
    """Each chosen API's three targets, plain then streamed, in turns; `FIRST_MS` makes each request take about a
    third of a second, so a target gets a hundredth of `--requests` (at least 4 a round)."""
    apis = _chosen(run.only)
    if not apis:
        return []
    requests = max(4 * run.rounds, run.requests // 100)
    levels = tuple(level for level in run.levels if level <= 8) or run.levels[:1]
    port = free_port()
    upstream = f"http://127.0.0.1:{port}/v1"
    ports = {mode: free_port() for mode in POLICIES}
    routers = {mode: f"http://127.0.0.1:{ports[mode]}" for mode in POLICIES}
    out: list[dict[str, Any]] = []
    with ExitStack() as stack:
        stack.enter_context(process([*_pin(0), PY, "-m", "benchmarks._upstream", str(port), "--first-ms",
                                     str(FIRST_MS)], f"{upstream}/chat/completions"))  # fmt: skip
        pids = {}
        for mode, policy in POLICIES.items():
            argv = [*_pin(1), PY, "-m", "benchmarks._proxy", "router", str(ports[mode]), upstream,
                    "--engine", f"fake{ENGINE_MS}ms", "--policy", policy]  # fmt: skip
            pids[mode] = stack.enter_context(process(argv, f"{routers[mode]}{APIS['chat']}")).pid
            load(f"{routers[mode]}{APIS['chat']}", 2, 8)  # warm up
        before = {mode: speculations(router) for mode, router in routers.items()}
        for stream in (False, True):
            targets = []
            for api in apis:
                sent = body(api, stream, run.work)
                path = APIS[api]
                targets.append(Target(row(api, DIRECT, stream), f"{upstream}{path.removeprefix('/v1')}",
                                      stream=stream, body=sent))  # fmt: skip
                targets += [Target(row(api, mode, stream), f"{routers[mode]}{path}", (lambda pid: lambda: [pid])(
                    pids[mode]), stream=stream, body=sent, gc=f"{routers[mode]}/_gc") for mode in POLICIES]  # fmt: skip
            out += interleaved(targets, levels, requests, run.rounds)
        after = {mode: speculations(router) for mode, router in routers.items()}
    run.extra["overlap speculations"] = {
        mode: {key: after[mode].get(key, 0) - before[mode].get(key, 0) for key in after[mode]} for mode in POLICIES
    }
    return out


def _parts(name: str) -> tuple[str, str, bool]:
    """A row name's API, target and whether it is streamed (`row()` backwards)."""
    prefix, _, rest = name.partition("overlap, ")
    title, _, target = rest.partition(": ")
    return APIS_BY_TITLE.get(title, ""), target, prefix == "stream, "


def summary(found: list[dict[str, Any]]) -> dict[str, str]:
    """Fill each router row's first byte added over the upstream's own, and the overlap row's over the no-overlap
    row's; return a line per API and mode (plain, streamed): the added first byte at each concurrency, both ways."""
    first: dict[tuple[str, int], float] = {}
    for each in found:
        data = each.get("_data") or {}
        if each["target"].removeprefix("stream, ").startswith("overlap, ") and data.get("ttfb_ms"):
            first[(each["target"], each["concurrency"])] = statistics.median(data["ttfb_ms"])
    mine = [each for each in found if (each["target"], each["concurrency"]) in first and _parts(each["target"])[0]]
    for each in mine:
        api, target, stream = _parts(each["target"])
        direct = first.get((row(api, DIRECT, stream), each["concurrency"]))
        if target in POLICIES and direct is not None:
            each["first byte added p50 ms"] = first[(each["target"], each["concurrency"])] - direct
    by = {(each["target"], each["concurrency"]): each for each in mine}
    lines: dict[str, str] = {}
    for each in mine:
        api, target, stream = _parts(each["target"])
        none = by.get((row(api, NONE, stream), each["concurrency"]), {})
        if target != OVERLAP or "first byte added p50 ms" not in each or "first byte added p50 ms" not in none:
            continue
        added, without = each["first byte added p50 ms"], none["first byte added p50 ms"]
        each["added vs no overlap"] = added / without if without else float("nan")
        own = first[(row(api, DIRECT, stream), each["concurrency"])]
        key = f"{'stream, ' * stream}overlap, {TITLES[api]}"
        part = (f"c={each['concurrency']}: first byte added p50 {added:.2f} ms with overlap, {without:.2f} ms "
                f"without ({each['added vs no overlap']:.2f}x); the upstream's own {own:.1f} ms")  # fmt: skip
        lines[key] = (f"{lines[key]}; {part}" if key in lines else
                      f"{key} (fake engine {ENGINE_MS} ms, upstream first token {FIRST_MS} ms): {part}")  # fmt: skip
    return lines
