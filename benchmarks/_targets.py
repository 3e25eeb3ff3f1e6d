"""The router benchmark's proxies and its main row registry: the rows loaded together in its first group of turns.

    targets = [proxy(stack, name, spec, upstream, extra) for name, spec in chosen(only, registry(baseline))]

`proxy()` starts one of benchmarks/_proxy.py's proxies (pinned to core 1, warmed up) until the stack closes and
records the engine calls it prints as it stops; `peer_targets()` does so for nginx and LiteLLM proxy
(benchmarks/_peers.py). `registry()` is every row of the first group, by name, with its `benchmarks._proxy`
arguments: the pass-throughs, the cache-hit rows (transports, metrics, gc, server, the other APIs, model rewritten,
answer guard), the session and key rows (benchmarks/_sessionrows.py, benchmarks/_keyrows.py), the fake engine and
facts-only rows, and with `--baseline` the other tree's cache-hit rows; `chosen()` those `--only` measures, with
the rows they are set against. Row families measured in groups of their own are benchmarks/_families.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import _keyrows, _peers, _sessionrows
from benchmarks._answers import PATHS
from benchmarks._apirows import GUARDED, REWRITE, REWRITTEN, body_file, picked
from benchmarks._harness import PY, Target, _pin, _tree, load, process
from d3backend import free_port

FACTS_ROW = "d3router facts-only policy (no engine)"


def registry(baseline: Path | None = None) -> list[tuple[str, list[str]]]:
    """The first group's rows: (name, `benchmarks._proxy` arguments), in the order they are reported."""
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
    if baseline is not None:  # the same rows, served by the other tree's code
        proxies += [(f"baseline tree: {name}", ["router", "--engine", "cache"])
                    for name in ("d3router cache hit", "responses cache hit", "messages cache hit")]  # fmt: skip
    return proxies


def chosen(only: list[str], proxies: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The rows of `proxies` that `--only` measures, and the rows those are set against."""
    return [
        (name, spec)
        for name, spec in proxies
        if picked(only, name)
        or _sessionrows.base(only, name)
        or _keyrows.base(only, name)
        or (name == "d3router cache hit" and picked(only, f"{name}, gc unsettled"))
    ]  # the unsettled row comes with the settled one it is set against


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
