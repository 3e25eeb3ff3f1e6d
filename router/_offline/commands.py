"""`d3router replay` and `d3router calibrate`: the commands around `replay.py` and `calibrate.py` beside this one.

d3router replay CONFIG TRAFFIC.jsonl [--against OTHER] [--json] [--html OUT] [--min-accuracy X] [--max-changed N]
d3router calibrate CONFIG TRAFFIC.jsonl --rule R | --condition 'jailbreak > 0.9' [--min-recall X | --max-share X]
                   [--engine NAME]        (an engine of engine.pool alone: calibrate per engine, issue 28)
                   [--answer]             (a rule of the answer guard, fitted on answer log lines)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from d3backend import CachedEngine, DecisionEngine, EmbeddedEngine, EngineError
from policies import Config, ConfigError, EngineSettings, load_config
from router._decision.engines import build_engine
from router._offline.calibrate import CalibrationError, Point, Threshold, curve, find_threshold, pick
from router._offline.calibrate import write_threshold as write_copy
from router._offline.cost import reference_problem
from router._offline.replay import Outcome, TrafficError, TrafficLine, read_traffic, replay
from router._offline.report import fmt, markdown, point_json, summarize
from router._offline.report_html import html_page

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def add_parsers(commands: Any) -> None:
    """Add `replay` and `calibrate` to the `d3router` subcommands."""
    rep = commands.add_parser("replay", help="decide recorded or written traffic and report what the policies do")
    _common(rep)
    rep.add_argument("--against", metavar="OTHER_CONFIG", help="replay through this one too; list changed decisions")
    rep.add_argument("--json", action="store_true", help="print the figures as JSON (for CI)")
    rep.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    rep.add_argument("--calibrate", metavar="RULE", help="the rule whose threshold curve the report shows")
    rep.add_argument("--min-accuracy", type=float, metavar="X", help="exit 1 when the accuracy is below X")
    rep.add_argument("--max-changed", type=int, metavar="N", help="exit 1 when over N decisions changed")
    rep.add_argument("--reference", metavar="UPSTREAM",
                     help="the saving against sending all the traffic to this (priced) upstream")  # fmt: skip
    rep.set_defaults(run=replay_command)
    cal = commands.add_parser("calibrate", help="a rule's threshold from labelled traffic")
    _common(cal)
    cal.add_argument("--rule", help="the rule whose `NAME OP NUMBER` threshold to calibrate")
    cal.add_argument("--condition", help="the comparison to calibrate, e.g. 'jailbreak > 0.9'")
    cal.add_argument("--answer", action="store_true",
                     help="a rule of the policy's answer guard, fitted on answer log lines (kind: answer)")  # fmt: skip
    target = cal.add_mutually_exclusive_group()
    target.add_argument("--target", choices=["best-f1"], default="best-f1", help="the best F1 (default)")
    target.add_argument("--min-recall", type=float, metavar="X", help="the best precision with recall >= X")
    target.add_argument("--max-share", type=float, metavar="X", help="the best recall taking at most X of lines")
    cal.add_argument("--write", metavar="OUT", help="write a copy of the configuration with the chosen threshold")
    cal.add_argument("--json", action="store_true", help="print the curve as JSON")
    cal.add_argument("--engine", metavar="NAME", help="ask only this engine of engine.pool (calibrate per engine)")
    cal.set_defaults(run=calibrate_command)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="CONFIG")
    parser.add_argument("traffic", metavar="TRAFFIC")
    parser.add_argument("--policy", help="the policy for lines whose model names none (and for calibrate)")
    parser.add_argument("--concurrency", type=_positive, default=8, help="lines decided at once (default 8)")
    parser.add_argument("--strict", action="store_true", help="a malformed line stops the run (exit 2)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, found {text}")
    return value


def _load(file: str, err: TextIO) -> Config | None:
    try:
        return load_config(file)
    except ConfigError as exc:
        for issue in exc.issues:
            print(f"error: {issue}", file=err)
        return None


async def _open(config: Config) -> DecisionEngine | None:
    if not any(policy.questions for policy in config.policies.values()):
        return None
    engine = build_engine(config.engine, base_dir=Path(config.file).parent, environ=os.environ)
    inner = engine.engine if isinstance(engine, CachedEngine) else engine
    if isinstance(inner, EmbeddedEngine):
        await inner.start()
    return engine


async def _run(
    configs: Sequence[Config], lines: Sequence[TrafficLine], args: argparse.Namespace, err: TextIO
) -> list[list[Outcome]]:
    """Replay through each configuration; equal engine settings share one engine (and its cache)."""
    engines: list[tuple[Config, DecisionEngine | None]] = []
    results = []
    try:
        for config in configs:
            engine = next((e for c, e in engines if c.engine == config.engine), None)
            if engine is None:
                engine = await _open(config)
            engines.append((config, engine))
            results.append(
                await replay(config, lines, engine=engine, concurrency=args.concurrency, fallback=args.policy,
                             progress=_progress(err, len(lines), config.file))
            )  # fmt: skip
    finally:
        for engine in {id(e): e for _, e in engines if e is not None}.values():
            await engine.aclose()
    return results


def _progress(err: TextIO, total: int, name: str) -> Callable[[int], None] | None:
    if not (hasattr(err, "isatty") and err.isatty()):
        return None

    def show(done: int) -> None:
        filled = done * 30 // max(total, 1)
        end = "\n" if done == total else ""
        print(f"\r{name}: [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}", end=end, file=err, flush=True)

    return show


def _prepare(args: argparse.Namespace, err: TextIO) -> tuple[Config, list[TrafficLine], list[Any]] | None:
    config = _load(args.file, err)
    if config is None:
        return None
    if args.policy is not None and args.policy not in config.policies:
        print(f"error: --policy {args.policy!r} names no policy of {config.file}", file=err)
        return None
    try:
        lines, bad = read_traffic(args.traffic, config, fallback=args.policy, strict=args.strict)
    except TrafficError as exc:
        print(f"error: {exc}", file=err)
        return None
    for item in bad:
        print(f"warning: {args.traffic}: {item}; skipped", file=err)
    return config, lines, bad


def replay_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    prepared = _prepare(args, err)
    if prepared is None:
        return EXIT_INVALID
    config, lines, bad = prepared
    if args.reference is not None and (problem := reference_problem(config, args.reference)) is not None:
        print(f"error: {problem}", file=err)
        return EXIT_INVALID
    configs = [config]
    if args.against is not None:
        other = _load(args.against, err)
        if other is None:
            return EXIT_INVALID
        configs.append(other)
    try:
        results = asyncio.run(_run(configs, lines, args, err))
    except EngineError as exc:
        print(f"error: the decision engine cannot start: {exc}", file=err)
        return EXIT_INVALID
    calibration = _auto_calibration(config, results[0], args.calibrate, args.policy)
    report = summarize(
        config, results[0], bad, against=(configs[1], results[1]) if len(results) > 1 else None,
        calibration=calibration, reference=args.reference,
    )  # fmt: skip
    if args.html:
        Path(args.html).write_text(html_page(report), encoding="utf-8")
    print(json.dumps(report, indent=2) if args.json else markdown(report), file=out, end="\n" if args.json else "")
    return _gate(report, args, err)


def _gate(report: dict[str, Any], args: argparse.Namespace, err: TextIO) -> int:
    code = EXIT_OK
    if args.min_accuracy is not None:
        accuracy = report["accuracy"]
        if accuracy is None or accuracy < args.min_accuracy:
            print(f"gate: accuracy {fmt(accuracy)} is below --min-accuracy {args.min_accuracy:g}", file=err)
            code = EXIT_FAILED
    if args.max_changed is not None and "changed" in report and report["changed"]["count"] > args.max_changed:
        print(f"gate: {report['changed']['count']} decisions changed, over --max-changed {args.max_changed}", file=err)
        code = EXIT_FAILED
    return code


def _auto_calibration(
    config: Config, outcomes: Sequence[Outcome], rule: str | None, fallback: str | None
) -> tuple[Threshold, list[Point], Point | None] | None:
    """The curve the HTML report shows: `--calibrate RULE`'s, else the first calibratable labelled rule's."""
    if not any(o.line.label is not None for o in outcomes):
        return None
    for name, policy in config.policies.items():
        for item in policy.rules:
            if (rule is not None and item.name != rule) or (fallback is not None and name != fallback):
                continue
            try:
                threshold = find_threshold(config, name, rule=item.name)
            except CalibrationError:
                continue
            points = curve(config, threshold, outcomes)
            if rule is not None or any(p.tp + p.fn for p in points):
                try:
                    chosen: Point | None = pick(points, "best-f1", current=threshold.value)
                except CalibrationError:
                    chosen = None
                return threshold, points, chosen
    return None


def one_engine(config: Config, name: str) -> Config:
    """`config` with the engine `name` of its `engine.pool` as its only engine (the pool's cache settings, the
    engine's own limits): its answers alone, for a threshold of that engine's (docs/engines.md#pools-across-kinds).
    `ValueError` naming the pool's engines when none is `name`, or when the engine is no pool."""
    settings = config.engine
    if settings.pool is None:
        raise ValueError(f"--engine {name!r} names an engine of engine.pool, but {config.file} has a {settings.kind} "
                         "engine alone; leave --engine out")  # fmt: skip
    names = [member.label for member in settings.pool]
    member = next((member for member in settings.pool if member.label == name), None)
    if member is None:
        raise ValueError(f"--engine {name!r} names no engine of engine.pool in {config.file}; its engines: "
                         f"{', '.join(names)}")  # fmt: skip
    alone = EngineSettings(
        remote=member.remote, decisions=member.decisions, cache=settings.cache,
        max_choice_options=member.max_choice_options or settings.max_choice_options,
    )  # fmt: skip
    return dataclasses.replace(config, engine=alone)


def calibrate_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.rule is None and args.condition is None:
        print("error: name the threshold with --rule RULE or --condition 'NAME OP NUMBER'", file=err)
        return EXIT_INVALID
    prepared = _prepare(args, err)
    if prepared is None:
        return EXIT_INVALID
    config, lines, _ = prepared
    if args.engine is not None:
        try:
            config = one_engine(config, args.engine)
        except ValueError as exc:
            print(f"error: {exc}", file=err)
            return EXIT_INVALID
    policy = args.policy or (next(iter(config.policies)) if len(config.policies) == 1 else None)
    if policy is None:
        print(f"error: {config.file} has several policies; name one with --policy", file=err)
        return EXIT_INVALID
    try:
        threshold = find_threshold(config, policy, rule=args.rule, condition=args.condition, answer=args.answer)
    except CalibrationError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_INVALID
    try:
        (outcomes,) = asyncio.run(_run([config], lines, args, err))
    except EngineError as exc:
        print(f"error: the decision engine cannot start: {exc}", file=err)
        return EXIT_INVALID
    points = curve(config, threshold, outcomes)
    target, level = ("min-recall", args.min_recall) if args.min_recall is not None else ("best-f1", None)
    if args.max_share is not None:
        target, level = "max-share", args.max_share
    try:
        chosen: Point | None = pick(points, target, level, current=threshold.value)  # type: ignore[arg-type]
    except CalibrationError as exc:
        print(f"calibrate: {exc}", file=err)
        chosen = None
    _print_curve(threshold, points, chosen, args, out)
    if chosen is None:
        return EXIT_FAILED
    if args.write:
        try:
            write_copy(config, threshold, chosen.threshold, args.write)
        except (CalibrationError, OSError) as exc:
            print(f"error: {exc}", file=err)
            return EXIT_FAILED
        print(f"wrote {args.write} with {threshold.name} {threshold.op} {chosen.threshold:g}", file=err)
    return EXIT_OK


def _print_curve(
    threshold: Threshold, points: Sequence[Point], chosen: Point | None, args: argparse.Namespace, out: TextIO
) -> None:
    if args.json:
        data = {
            "policy": threshold.policy, "rule": threshold.rule, "condition": threshold.text,
            "points": [point_json(p) for p in points], "chosen": point_json(chosen) if chosen else None,
        }  # fmt: skip
        print(json.dumps(data, indent=2), file=out)
        return
    print(f"{threshold.policy} / {threshold.rule}: {threshold.text}", file=out)
    print(f"{'threshold':>10} {'precision':>10} {'recall':>8} {'f1':>6} {'share':>6}", file=out)
    for p in points:
        mark = "  <- chosen" if p is chosen else ("  (current)" if p.threshold == threshold.value else "")
        print(f"{p.threshold:>10g} {fmt(p.precision):>10} {fmt(p.recall):>8} {fmt(p.f1):>6} {fmt(p.share):>6}{mark}",
              file=out)  # fmt: skip
    if chosen is not None:
        print(f"chosen: {threshold.name} {threshold.op} {chosen.threshold:g} (precision {fmt(chosen.precision)}, "
              f"recall {fmt(chosen.recall)}, F1 {fmt(chosen.f1)}, share {fmt(chosen.share)})", file=out)  # fmt: skip
