"""The figures of a replay (the `--json` document) and their Markdown summary.

report = summarize(config, outcomes, bad, against=(other, other_outcomes))
report["accuracy"], report["confusion"]["rule"], report["changed"]["count"]
print(markdown(report))
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from policies import Config
from router._offline.calibrate import Point, Threshold
from router._offline.cost import costs, money
from router._offline.replay import BadLine, Outcome


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (`q` in 0..100), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def predicted(outcome: Outcome, kind: str) -> str:
    """What a decision says in a label's terms: the rule's name, or the upstream / "block"."""
    return outcome.rule if kind == "rule" else outcome.target


def confusion(outcomes: Sequence[Outcome], kind: str) -> dict[str, Any] | None:
    """Rows: the labels; columns: the decisions; per-class precision and recall (None without a denominator)."""
    pairs = []
    for o in outcomes:
        label = o.line.label
        if label is None or o.policy is None or o.error is not None:
            continue
        if (label.kind == "rule") != (kind == "rule"):
            continue
        pairs.append((label.value, predicted(o, kind)))
    if not pairs:
        return None
    classes = sorted({c for pair in pairs for c in pair})
    counts = Counter(pairs)
    matrix = [[counts[(actual, guess)] for guess in classes] for actual in classes]
    precision: dict[str, float | None] = {}
    recall: dict[str, float | None] = {}
    for i, name in enumerate(classes):
        column = sum(row[i] for row in matrix)
        row_total = sum(matrix[i])
        precision[name] = matrix[i][i] / column if column else None
        recall[name] = matrix[i][i] / row_total if row_total else None
    return {"classes": classes, "matrix": matrix, "precision": precision, "recall": recall}


def _decision(o: Outcome) -> str:
    if o.kind == "answer":
        return f"answer {o.rule} ({o.action})"
    return "(no policy)" if o.policy is None else f"{o.rule} ({o.action} {o.target})" if o.action == "route" else o.rule


def changed(before: Sequence[Outcome], after: Sequence[Outcome]) -> dict[str, Any]:
    """Every line whose decision differs (rule, action or upstream), and the counts per `old -> new` pair."""
    lines = []
    for old, new in zip(before, after, strict=True):
        if (old.policy, old.rule, old.action, old.upstream) == (new.policy, new.rule, new.action, new.upstream):
            continue
        if old.error is not None or new.error is not None:
            continue  # an engine failure is not a policy change; both are counted in engine_errors
        same_rule = old.rule == new.rule and old.policy == new.policy
        lines.append({
            "line": old.line.line,
            "old": _decision(old) if same_rule or old.kind == "answer" else old.rule or "(no policy)",
            "new": _decision(new) if same_rule or new.kind == "answer" else new.rule or "(no policy)",
        })  # fmt: skip
    pairs = Counter(f"{item['old']} -> {item['new']}" for item in lines)
    return {"count": len(lines), "pairs": dict(pairs.most_common()), "lines": lines}


def summarize(
    config: Config,
    outcomes: Sequence[Outcome],
    bad: Sequence[BadLine] = (),
    *,
    against: tuple[Config, Sequence[Outcome]] | None = None,
    calibration: tuple[Threshold, Sequence[Point], Point | None] | None = None,
    reference: str | None = None,
) -> dict[str, Any]:
    """The replay's figures, as `--json` prints them; answer lines (issue 27) in `answers`, apart; what the traffic
    costs on the replayed routes (and saves against `reference`) in `cost` (router/_offline/cost.py)."""
    judged = [o for o in outcomes if o.kind == "answer"]
    decided = [o for o in outcomes if o.policy is not None and o.kind == "request"]
    ok = [o for o in decided if o.error is None]
    blocked = sum(1 for o in decided if o.action == "block")
    latencies = [o.decision_ms for o in decided]
    labelled = [o for o in ok if o.line.label is not None]
    correct = sum(
        1 for o in labelled if o.line.label is not None and predicted(o, o.line.label.kind) == o.line.label.value
    )
    report: dict[str, Any] = {
        "config": config.file,
        "lines": len(outcomes) + len(bad),
        "decided": len(decided),
        "skipped": [{"line": b.line, "error": b.error} for b in bad],
        "no_policy": [{"line": o.line.line, "model": o.line.body.get("model")} for o in outcomes if o.policy is None],
        "engine_errors": [{"line": o.line.line, "error": o.error} for o in decided if o.error is not None],
        "retried": sum(1 for o in decided if o.retried),
        "media_missing": sum(1 for o in decided if o.line.media_missing),
        "per_rule": dict(Counter(o.rule for o in decided).most_common()),
        "per_upstream": dict(Counter(o.upstream for o in decided if o.upstream is not None).most_common()),
        "blocked": blocked,
        "block_rate": blocked / len(decided) if decided else None,
        "latency_ms": _latency(latencies),
        "labelled": len(labelled),
        "accuracy": correct / len(labelled) if labelled else None,
        "confusion": {kind: table for kind in ("rule", "route") if (table := confusion(ok, kind)) is not None},
    }
    if judged:
        report["answers"] = _answers(judged)
    if (spent := costs(config, outcomes, reference)) is not None:
        report["cost"] = spent
    if against is not None:
        report["against"] = against[0].file
        report["changed"] = changed(outcomes, against[1])
    if calibration is not None:
        threshold, points, chosen = calibration
        report["calibration"] = {
            "policy": threshold.policy, "rule": threshold.rule, "condition": threshold.text,
            "points": [point_json(p) for p in points], "chosen": point_json(chosen) if chosen is not None else None,
        }  # fmt: skip
    return report


def _answers(judged: Sequence[Outcome]) -> dict[str, Any]:
    """The answer lines' figures: verdicts per answer rule and outcome, blocks, accuracy against their labels."""
    decided = [o for o in judged if o.policy is not None]
    ok = [o for o in decided if o.error is None]
    labelled = [o for o in ok if o.line.label is not None]
    correct = sum(
        1 for o in labelled if o.line.label is not None and predicted(o, o.line.label.kind) == o.line.label.value
    )
    return {
        "judged": len(decided),
        "per_rule": dict(Counter(o.rule for o in decided).most_common()),
        "per_outcome": dict(Counter(o.action for o in decided).most_common()),
        "blocked": sum(1 for o in decided if o.action == "block"),
        "engine_errors": [{"line": o.line.line, "error": o.error} for o in decided if o.error is not None],
        "latency_ms": _latency([o.decision_ms for o in decided]),
        "labelled": len(labelled),
        "accuracy": correct / len(labelled) if labelled else None,
        "confusion": {kind: table for kind in ("rule", "route") if (table := confusion(ok, kind)) is not None},
    }


def _latency(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values) if values else None}


def point_json(p: Point) -> dict[str, Any]:
    return {"threshold": p.threshold, "precision": p.precision, "recall": p.recall, "f1": p.f1, "share": p.share,
            "tp": p.tp, "fp": p.fp, "fn": p.fn}  # fmt: skip


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The human summary `d3router replay` prints by default."""
    out = [f"# Replay of {report['config']}", ""]
    out.append(f"{report['decided']} of {report['lines']} lines decided; {len(report['skipped'])} skipped, "
               f"{len(report['no_policy'])} without a policy, {len(report['engine_errors'])} engine errors "
               f"({report['retried']} retried).")  # fmt: skip
    lat = report["latency_ms"]
    out.append(f"Block rate {fmt(report['block_rate'])}; engine latency p50 {fmt(lat['p50'], 2)} ms, "
               f"p95 {fmt(lat['p95'], 2)} ms.")  # fmt: skip
    if report["media_missing"]:
        out.append(f"{report['media_missing']} logged lines had media the log did not keep; decided on text only.")
    out += ["", "| rule | decisions |", "| --- | ---: |"]
    out += [f"| {rule} | {n} |" for rule, n in report["per_rule"].items()]
    out += ["", "| upstream | decisions |", "| --- | ---: |"]
    out += [f"| {up} | {n} |" for up, n in report["per_upstream"].items()]
    if report["accuracy"] is not None:
        out += ["", f"**Accuracy {fmt(report['accuracy'])}** over {report['labelled']} labelled lines."]
    for kind, table in report["confusion"].items():
        classes = table["classes"]
        out += ["", f"Confusion by {kind} (rows: label, columns: decision)", ""]
        out += ["| label \\ decision | " + " | ".join(classes) + " | precision | recall |"]
        out += ["| --- |" + " ---: |" * (len(classes) + 2)]
        for name, row in zip(classes, table["matrix"], strict=True):
            cells = " | ".join(str(n) for n in row)
            out.append(f"| {name} | {cells} | {fmt(table['precision'][name])} | {fmt(table['recall'][name])} |")
    if "cost" in report:
        out += _cost_markdown(report["cost"])
    if "answers" in report:
        out += _answers_markdown(report["answers"])
    if "changed" in report:
        change = report["changed"]
        out += ["", f"**{change['count']} decisions changed** against {report['against']}.", ""]
        if change["count"]:
            out += ["| old -> new | lines |", "| --- | ---: |"]
            out += [f"| {pair} | {n} |" for pair, n in change["pairs"].items()]
            out += ["", "Lines: " + ", ".join(f"{c['line']} ({c['old']} -> {c['new']})" for c in change["lines"])]
    for item in report["skipped"]:
        out.append(f"- skipped line {item['line']}: {item['error']}")
    for item in report["no_policy"]:
        out.append(f"- line {item['line']}: model {item['model']!r} names no policy (the router passes it through)")
    for item in report["engine_errors"]:
        out.append(f"- line {item['line']}: the engine failed twice: {item['error']}")
    return "\n".join(out) + "\n"


def _answers_markdown(answers: dict[str, Any]) -> list[str]:
    lat = answers["latency_ms"]
    out = ["", f"## Answers: {answers['judged']} judged by answer guards", "",
           f"{answers['blocked']} blocked, {len(answers['engine_errors'])} engine errors; engine latency p50 "
           f"{fmt(lat['p50'], 2)} ms.", "", "| answer rule | verdicts |", "| --- | ---: |"]  # fmt: skip
    out += [f"| {rule} | {n} |" for rule, n in answers["per_rule"].items()]
    out += ["", "| outcome | verdicts |", "| --- | ---: |"]
    out += [f"| {outcome} | {n} |" for outcome, n in answers["per_outcome"].items()]
    if answers["accuracy"] is not None:
        out += ["", f"**Answer accuracy {fmt(answers['accuracy'])}** over {answers['labelled']} labelled lines."]
    return out


def _cost_markdown(spent: dict[str, Any]) -> list[str]:
    tokens = spent["tokens"]
    out = ["", f"## Cost: {money(spent['policy'])} on the replayed routes", "",
           f"{spent['lines']} decided lines: {tokens['input']} input tokens ({tokens['cached']} cached), "
           f"{tokens['output']} output; {spent['estimated']} without reported usage (input estimated from the text, "
           "output unknown).", "", "| upstream | cost |", "| --- | ---: |"]  # fmt: skip
    out += [f"| {name} | {money(value)} |" for name, value in spent["per_upstream"].items()]
    if spent["logged"] is not None:
        out += ["", f"Logged cost of these lines: {money(spent['logged'])}."]
    if spent["unpriced"]:
        out += ["", "Unpriced (not counted): " + ", ".join(f"{n} ({c} lines)" for n, c in spent["unpriced"].items())]
    if "reference" in spent:
        ref = spent["reference"]
        share = f" ({fmt(ref['saving_share'])} of it)" if ref["saving_share"] is not None else ""
        out += ["", f"**Saving {money(ref['saving'])}**{share} against all traffic to {ref['upstream']} "
                f"({money(ref['cost'])}); the same tokens priced on each route."]  # fmt: skip
    return out
