"""`replay --html`: one self-contained page (inline CSS and SVG, no network when viewed) of a replay's figures.

    Path("report.html").write_text(html_page(summarize(config, outcomes)))

The page carries the report's JSON too (`<script type="application/json" id="d3-report">`), and marks every
figure with an id or `data-*` attributes, so that a browser test can check what it shows against the JSON.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from router._offline.cost import money
from router._offline.report import fmt

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:60rem;color:#1d2330;padding:0 1rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #d9dde5}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d9dde5;padding:.25rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}.figure{font-size:1.6rem;font-weight:600}
.figures{display:flex;gap:2rem;flex-wrap:wrap}.figures div{min-width:8rem}.muted{color:#69707d}
td.heat{min-width:2.5rem;text-align:center}svg text{font:11px system-ui,sans-serif;fill:#1d2330}
"""
_JS = """
document.querySelectorAll('td.heat').forEach(function (cell) {
  cell.title = cell.dataset.actual + ' labelled, decided ' + cell.dataset.predicted + ': ' + cell.textContent;
});
"""


def html_page(report: dict[str, Any]) -> str:
    """The whole page for a `summarize()` report."""
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width,initial-scale=1'>",
        f"<title>d3-router replay: {escape(str(report['config']))}</title><style>{_CSS}</style></head><body>",
        f"<h1>Replay of <code>{escape(str(report['config']))}</code></h1>",
        _figures(report),
        _counts("Decisions per rule", "per-rule", report["per_rule"]),
        _counts("Decisions per upstream", "per-upstream", report["per_upstream"]),
    ]
    for kind, table in report["confusion"].items():
        parts.append(_heatmap(kind, table))
    if "cost" in report:
        parts.append(_cost(report["cost"]))
    if "answers" in report:
        parts.append(_answers(report["answers"]))
    if report.get("calibration"):
        parts.append(_curve(report["calibration"]))
    if "changed" in report:
        parts.append(_changed(report))
    data = json.dumps(report).replace("</", "<\\/")
    parts.append(f"<script type='application/json' id=d3-report>{data}</script><script>{_JS}</script></body></html>")
    return "\n".join(parts)


def _figures(report: dict[str, Any]) -> str:
    lat = report["latency_ms"]
    items = [
        ("lines", str(report["lines"]), "lines"), ("decided", str(report["decided"]), "decided"),
        ("accuracy", fmt(report["accuracy"]), "accuracy"), ("block-rate", fmt(report["block_rate"]), "block rate"),
        ("p50", fmt(lat["p50"], 2), "engine p50 ms"), ("p95", fmt(lat["p95"], 2), "engine p95 ms"),
        ("skipped", str(len(report["skipped"])), "skipped lines"),
        ("engine-errors", str(len(report["engine_errors"])), "engine errors"),
    ]  # fmt: skip
    cells = "".join(
        f"<div><div class=figure id={i}>{v}</div><div class=muted>{escape(t)}</div></div>" for i, v, t in items
    )
    return f"<div class=figures>{cells}</div>"


def _counts(title: str, ident: str, counts: dict[str, int]) -> str:
    total = sum(counts.values()) or 1
    rows = "".join(
        f"<tr data-name='{escape(name)}'><td>{escape(name)}</td><td class=count>{n}</td>"
        f"<td><svg width=200 height=12><rect width={200 * n / total:.1f} height=12 fill='#4a78c2'/></svg></td></tr>"
        for name, n in counts.items()
    )
    return f"<h2>{title}</h2><table id={ident}><tr><th>name</th><th>decisions</th><th></th></tr>{rows}</table>"


def _heatmap(kind: str, table: dict[str, Any]) -> str:
    classes = table["classes"]
    top = max((n for row in table["matrix"] for n in row), default=0) or 1
    head = "".join(f"<th>{escape(c)}</th>" for c in classes)
    rows = []
    for actual, row in zip(classes, table["matrix"], strict=True):
        cells = []
        for guess, n in zip(classes, row, strict=True):
            alpha = 0.08 + 0.85 * n / top if n else 0.0
            color = f"rgba(46,125,50,{alpha:.2f})" if actual == guess else f"rgba(198,40,40,{alpha:.2f})"
            cells.append(f"<td class=heat data-actual='{escape(actual)}' data-predicted='{escape(guess)}' "
                         f"style='background:{color}'>{n}</td>")  # fmt: skip
        rows.append(
            f"<tr><th>{escape(actual)}</th>{''.join(cells)}<td class=precision>{fmt(table['precision'][actual])}</td>"
            f"<td class=recall>{fmt(table['recall'][actual])}</td></tr>"
        )
    return (
        f"<h2>Confusion matrix by {kind}</h2><p class=muted>rows: label; columns: decision</p>"
        f"<table id=confusion-{kind}><tr><th>label \\ decision</th>{head}<th>precision</th><th>recall</th></tr>"
        f"{''.join(rows)}</table>"
    )


def _curve(cal: dict[str, Any]) -> str:
    points = cal["points"]
    width, height, pad = 560, 260, 36
    xs = [p["threshold"] for p in points]
    lo, hi = min(xs), max(xs)
    span = (hi - lo) or 1.0

    def x(value: float) -> float:
        return float(pad + (value - lo) / span * (width - 2 * pad))

    def y(value: float) -> float:
        return float(height - pad - value * (height - 2 * pad))

    lines = []
    for key, color in (("precision", "#4a78c2"), ("recall", "#c27a4a"), ("f1", "#2e7d32"), ("share", "#888")):
        coords = " ".join(f"{x(p['threshold']):.1f},{y(p[key]):.1f}" for p in points if p[key] is not None)
        lines.append(f"<polyline class='series' data-series={key} fill=none stroke='{color}' stroke-width=2 "
                     f"points='{coords}'/>")  # fmt: skip
        legend_y = 14 + 14 * len(lines)
        lines.append(f"<text x={width - 90} y={legend_y} fill='{color}'>{key}</text>")
    chosen = cal["chosen"]
    if chosen is not None:
        cx = x(chosen["threshold"])
        lines.append(f"<line id=chosen x1={cx:.1f} x2={cx:.1f} y1={pad} y2={height - pad} stroke='#000' "
                     f"stroke-dasharray='4 3' data-threshold='{chosen['threshold']}'/>")  # fmt: skip
    axes = (
        f"<line x1={pad} y1={height - pad} x2={width - pad} y2={height - pad} stroke='#999'/>"
        f"<line x1={pad} y1={pad} x2={pad} y2={height - pad} stroke='#999'/>"
        f"<text x={pad} y={height - 12}>{lo:g}</text><text x={width - pad - 20} y={height - 12}>{hi:g}</text>"
        f"<text x=4 y={pad + 4}>1</text><text x=4 y={height - pad}>0</text>"
    )
    rows = "".join(
        f"<tr><td>{p['threshold']:g}</td><td>{fmt(p['precision'])}</td><td>{fmt(p['recall'])}</td>"
        f"<td>{fmt(p['f1'])}</td><td>{fmt(p['share'])}</td></tr>"
        for p in points
    )
    pick = f"best F1 at {chosen['threshold']:g}" if chosen else "no threshold meets the target"
    return (
        f"<h2>Calibration: {escape(cal['rule'])} (<code>{escape(cal['condition'])}</code>)</h2>"
        f"<p id=calibration-chosen>{escape(pick)}</p>"
        f"<svg id=calibration width={width} height={height} role=img aria-label='calibration curve'>{axes}"
        f"{''.join(lines)}</svg>"
        f"<details><summary>all {len(points)} thresholds</summary>"
        f"<table id=calibration-points><tr><th>threshold</th><th>precision</th><th>recall</th><th>F1</th>"
        f"<th>share</th></tr>{rows}</table></details>"
    )


def _changed(report: dict[str, Any]) -> str:
    change = report["changed"]
    pairs = "".join(f"<tr><td>{escape(pair)}</td><td class=count>{n}</td></tr>" for pair, n in change["pairs"].items())
    lines = "".join(
        f"<tr data-line={c['line']}><td>{c['line']}</td><td>{escape(c['old'])}</td><td>{escape(c['new'])}</td></tr>"
        for c in change["lines"]
    )
    return (
        f"<h2>Changed decisions against <code>{escape(str(report['against']))}</code>: "
        f"<span id=changed-count>{change['count']}</span></h2>"
        f"<table id=changed-pairs><tr><th>old -&gt; new</th><th>lines</th></tr>{pairs}</table>"
        f"<table id=changed-lines><tr><th>line</th><th>old</th><th>new</th></tr>{lines}</table>"
    )


def _cost(spent: dict[str, Any]) -> str:
    tokens = spent["tokens"]
    rows = "".join(f"<tr data-name='{escape(name)}'><td>{escape(name)}</td><td class=cost>{money(value)}</td></tr>"
                   for name, value in spent["per_upstream"].items())  # fmt: skip
    saving = ""
    if "reference" in spent:
        ref = spent["reference"]
        saving = (
            f"<p>Saving <span class=figure id=cost-saving>{money(ref['saving'])}</span> "
            f"(<span id=cost-saving-share>{fmt(ref['saving_share'])}</span>) against all traffic to "
            f"<code id=cost-reference>{escape(ref['upstream'])}</code>, which would cost "
            f"<span id=cost-reference-cost>{money(ref['cost'])}</span>; the same tokens priced on each route.</p>"
        )
    unpriced = ", ".join(f"{escape(n)} ({c} lines)" for n, c in spent["unpriced"].items())
    return (
        f"<h2>Cost: <span id=cost-policy>{money(spent['policy'])}</span> on the replayed routes</h2>{saving}"
        f"<p class=muted>{spent['lines']} decided lines: {tokens['input']} input tokens ({tokens['cached']} cached), "
        f"{tokens['output']} output; <span id=cost-estimated>{spent['estimated']}</span> without reported usage "
        f"(input estimated, output unknown){'; unpriced: ' + unpriced if unpriced else ''}.</p>"
        f"<table id=cost-per-upstream><tr><th>upstream</th><th>cost</th></tr>{rows}</table>"
    )


def _answers(answers: dict[str, Any]) -> str:
    return (
        f"<h2>Answers: <span id=answers-judged>{answers['judged']}</span> judged by answer guards</h2>"
        f"<p><span id=answers-blocked>{answers['blocked']}</span> blocked, "
        f"{len(answers['engine_errors'])} engine errors; accuracy {fmt(answers['accuracy'])}.</p>"
        + _counts("Verdicts per answer rule", "answers-per-rule", answers["per_rule"])
        + _counts("Verdicts per outcome", "answers-per-outcome", answers["per_outcome"])
    )
