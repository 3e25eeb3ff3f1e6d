"""How long a policy takes: evaluating a 20-rule policy, and loading a 64-question, 100-rule file.

    python -m benchmarks.policy [--quick]

Targets on the project's 2-core machine: evaluation <= 20 us median, loading <= 50 ms median.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from benchmarks._report import add_arguments, write
from d3backend import ChoiceAnswer, NoulAnswer, ScoreAnswer
from policies import parse_config

LEVELS = ["trivial", "easy", "moderate", "hard", "expert"]


def config_text(questions: int, rules: int) -> str:
    """A policy with `questions` questions (a third each choice, noul and score) and `rules` rules."""
    lines = ["upstreams:", "  small: {url: http://127.0.0.1:8001/v1}", "  large: {url: http://127.0.0.1:8002/v1}"]
    lines += ["policies:", "  auto:", "    questions:"]
    for i in range(questions):
        kind = ("choice", "noul", "score")[i % 3]
        if kind == "choice":
            criteria = "{code: Writing code, math: Mathematics, chat: null, other: null}"
        elif kind == "noul":
            criteria = "{true: it does, false: it does not}"
        else:
            criteria = "[" + ", ".join(LEVELS) + "]"
        lines.append(f"      q{i}: {{type: {kind}, instructions: Question number {i}?, criteria: {criteria}}}")
    lines.append("    rules:")
    for r in range(rules - 1):
        i = r % questions
        kind = ("choice", "noul", "score")[i % 3]
        cond = {
            "choice": f'q{i} == "code" and q{i}.confidence > 0.5',
            "noul": f"q{i} > 0.9 or q{i}.no > 0.99",
            "score": f"q{i} >= 3.5 and q{i}.expert > 0.4",
        }[kind]
        action = "tag: {x-seen: 'yes'}" if r % 2 else "route: [large, small]"
        lines.append(f"      - {{name: r{r}, when: '{cond}', {action}}}")
    lines.append("      - {name: default, route: small}")
    return "\n".join(lines) + "\n"


def answers(questions: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for i in range(questions):
        kind = ("choice", "noul", "score")[i % 3]
        if kind == "choice":
            out[f"q{i}"] = ChoiceAnswer("chat", {"code": 0.1, "math": 0.1, "chat": 0.7, "other": 0.1}, 0.7)
        elif kind == "noul":
            out[f"q{i}"] = NoulAnswer(0.2, 0.8)
        else:
            out[f"q{i}"] = ScoreAnswer(1.2, tuple(LEVELS), (0.2, 0.5, 0.2, 0.05, 0.05), 0.5)
    return out


def batches_us(fn: Callable[[], object], repeat: int, number: int) -> list[float]:
    """Microseconds a call of `fn`, in each of `repeat` batches of `number` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number * 1e6)
    return samples


def median_us(fn: Callable[[], object], repeat: int, number: int) -> float:
    return statistics.median(batches_us(fn, repeat, number))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    args = parser.parse_args()
    repeat = 3 if args.quick else 15

    policy = parse_config(config_text(20, 20)).policies["auto"]
    given = answers(20)
    decision = policy.evaluate(given)  # every rule is tried: none of the conditions holds
    if decision.rule != "default" or len(decision.trace) != 20:
        raise RuntimeError(f"the benchmark policy should try all 20 rules, it tried {len(decision.trace)}")
    evaluate = median_us(lambda: policy.evaluate(given), repeat, 100 if args.quick else 20_000)

    big = config_text(64, 100)
    load = median_us(lambda: parse_config(big), repeat, 1 if args.quick else 5) / 1000

    rows = [
        {
            "measure": "evaluate a 20-rule policy (all rules tried)",
            "median": f"{evaluate:.1f} us",
            "target": "<= 20 us",
        },
        {"measure": "load a 64-question, 100-rule file", "median": f"{load:.1f} ms", "target": "<= 50 ms"},
    ]
    print(write("policy", rows, ["measure", "median", "target"], "python -m benchmarks.policy", args.results))


if __name__ == "__main__":
    main()
