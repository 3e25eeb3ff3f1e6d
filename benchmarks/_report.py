"""Writing a benchmark's results: a JSON file for machines and a markdown table for the README."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def add_arguments(parser: Any) -> None:
    """The options every benchmark takes."""
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks that the harness runs")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write the JSON and markdown")


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def write(
    name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], command: str, directory: Path = RESULTS
) -> str:
    """Write `<directory>/<name>.json` and `<directory>/<name>.md`; return the markdown table."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"command": command, "machine": machine(), "rows": list(rows)}
    (directory / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(column, "")) for column in columns) + " |")
    info = payload["machine"]
    table = "\n".join(lines)
    text = f"{table}\n\n`{command}` on {info['cores']} cores, Python {info['python']}, {info['date']}.\n"
    (directory / f"{name}.md").write_text(text, encoding="utf-8")
    return text


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if value < 100 else f"{value:.0f}"
    return str(value)
