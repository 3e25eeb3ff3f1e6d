"""What refusing duplicate JSON keys costs (issue 16): the body parse with and without the unique-keys check.

    python -m benchmarks.body

Side by side, alternating, on two bodies: a plain chat request and an agent's request (20 turns, 30 tool schemas).
"""

from __future__ import annotations

import json
import timeit

from router._apis.body import parse_json

TASK = "Write a function that merges two sorted lists in C, with tests."
CHAT = {"model": "auto", "max_tokens": 256, "temperature": 0.2,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TASK}]}  # fmt: skip
AGENT = {
    "model": "auto",
    "messages": [{"role": "user" if i % 2 else "assistant", "content": "x" * 2000} for i in range(20)],
    "tools": [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string", "description": "d"} for j in range(10)}}}}
        for i in range(30)],
}  # fmt: skip


def objects(value: object) -> int:
    if isinstance(value, dict):
        return 1 + sum(objects(v) for v in value.values())
    if isinstance(value, list):
        return sum(objects(v) for v in value)
    return 0


def main() -> None:
    print("| body | bytes | JSON objects | json.loads us | with the check us | added us | per object us |")
    print("|---|---|---|---|---|---|---|")
    for name, body in (("chat", CHAT), ("agent, 20 turns + 30 tools", AGENT)):
        raw = json.dumps(body).encode()
        number = max(50, 2_000_000 // len(raw))
        plain, checked = [], []
        for _ in range(7):  # alternate, so drift hits both alike
            plain.append(timeit.timeit(lambda raw=raw: json.loads(raw), number=number) / number * 1e6)
            checked.append(timeit.timeit(lambda raw=raw: parse_json(raw), number=number) / number * 1e6)
        a, b = min(plain), min(checked)
        count = objects(body)
        print(f"| {name} | {len(raw)} | {count} | {a:.1f} | {b:.1f} | {b - a:.1f} | {(b - a) / count:.2f} |")


if __name__ == "__main__":
    main()
