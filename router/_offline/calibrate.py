"""`d3router calibrate`: a rule's threshold from labelled traffic.

    threshold = find_threshold(config, "auto", rule="refuse-jailbreak")     # the 0.9 of `jailbreak > 0.9`
    points = curve(config, threshold, outcomes)                              # precision/recall/F1/share per value
    best = pick(points, "best-f1")  |  pick(points, "min-recall", 0.9)  |  pick(points, "max-share", 0.2)
    write_threshold(config, threshold, best.threshold, "out.yaml")          # a copy, comments kept

The engine is asked once per line (by `replay`); each candidate threshold then re-evaluates the policy, with the
condition recompiled at that value, over the recorded answers: the curve is what the router would have decided.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import yaml

from d3backend import Answer, ChoiceAnswer, NoulAnswer, ScoreAnswer
from policies import AnswerGuard, Block, Config, ConfigError, Policy, Route, Rule, compile_condition, load_config
from router._offline.replay import Label, Outcome

Target = Literal["best-f1", "min-recall", "max-share"]
_NUMBER = r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_COMPARISON = re.compile(
    r"(?<![\w.\]\"'])(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\"[^\"]*\"\]|\['[^']*'\])?)\s*"
    rf"(?P<op><=|>=|<|>)\s*(?P<number>{_NUMBER})(?![\w.])"
)


class CalibrationError(Exception):
    """The rule or condition cannot be calibrated, or no threshold meets the target."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """The number in `NAME OP NUMBER` inside rule `rule` of `policy`; `index` counts such comparisons."""

    policy: str
    rule: str
    rule_index: int
    name: str
    op: str
    value: float
    index: int
    start: int  # the number's span in the rule's `when`
    end: int
    answer: bool = False  # a rule of the policy's answer guard (issue 27), fitted on answer lines

    @property
    def lines(self) -> str:
        """The kind of traffic line (`Outcome.kind`) the threshold is fitted on."""
        return "answer" if self.answer else "request"

    @property
    def text(self) -> str:
        return f"{self.name} {self.op} {self.value:g}"


@dataclass(frozen=True, slots=True)
class Point:
    threshold: float
    precision: float | None
    recall: float | None
    f1: float | None
    share: float  # the share of the policy's lines the rule takes
    tp: int
    fp: int
    fn: int


def find_threshold(
    config: Config, policy: str, *, rule: str | None = None, condition: str | None = None, answer: bool = False
) -> Threshold:
    """The comparison to calibrate: `rule`'s only `NAME OP NUMBER`, or the rule holding `condition`; with `answer`,
    among the rules of the policy's answer guard."""
    if policy not in config.policies:
        raise CalibrationError(f"no policy {policy!r}; expected one of {', '.join(map(repr, config.policies))}")
    rules = _rules(config.policies[policy], answer)
    wanted = _COMPARISON.fullmatch(condition.strip()) if condition is not None else None
    if condition is not None and wanted is None:
        raise CalibrationError(f"--condition {condition!r} is not a comparison NAME OP NUMBER, e.g. 'jailbreak > 0.9'")
    found: list[Threshold] = []
    for index, item in enumerate(rules):
        if (rule is not None and item.name != rule) or item.when is None:
            continue
        for count, match in enumerate(_COMPARISON.finditer(item.when)):
            if wanted is not None and (
                match["name"] != wanted["name"] or match["op"] != wanted["op"]
                or float(match["number"]) != float(wanted["number"])
            ):  # fmt: skip
                continue
            found.append(
                Threshold(policy, item.name, index, match["name"], match["op"], float(match["number"]), count,
                          match.start("number"), match.end("number"), answer)
            )  # fmt: skip
    names = {item.name for item in rules}
    kind = "answer rule" if answer else "rule"
    if rule is not None and rule not in names:
        raise CalibrationError(f"policy {policy!r} has no {kind} {rule!r}; expected one of {', '.join(sorted(names))}")
    what = f"{kind} {rule!r}" if rule is not None else f"policy {policy!r}" + ("'s answer guard" if answer else "")
    if not found:
        extra = f" matching {condition!r}" if condition is not None else " (NAME OP NUMBER, e.g. jailbreak > 0.9)"
        raise CalibrationError(f"{what} has no comparison{extra} to calibrate")
    if len(found) > 1:
        listed = "; ".join(f"{t.rule}: {t.text}" for t in found)
        raise CalibrationError(f"{what} has {len(found)} comparisons ({listed}); pick one with --condition/--rule")
    return found[0]


def value_of(name: str, answers: Mapping[str, Answer]) -> float | None:
    """What `NAME` reads in a condition (router-side mirror of policies/_expr.py's operands)."""
    match = re.fullmatch(r"([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*)|\[[\"'](.*)[\"']\])?", name)
    if match is None or match[1] not in answers:
        return None
    answer, option = answers[match[1]], match[2] or match[3]
    if option == "confidence":
        return answer.confidence
    if isinstance(answer, NoulAnswer):
        return 1.0 - answer.noul if option == "no" else answer.noul
    if isinstance(answer, ChoiceAnswer):
        return answer.probabilities.get(option) if option else None
    if not isinstance(answer, ScoreAnswer):
        raise TypeError(f"an answer of an unknown type: {type(answer).__name__}")
    if option is None:
        return answer.score
    levels = list(answer.legend)
    return answer.probabilities[levels.index(option)] if option in levels else None


def _rules(policy: Policy, answer: bool) -> tuple[Rule, ...]:
    if not answer:
        return policy.rules
    if policy.answer is None:
        raise CalibrationError(f"policy {policy.name!r} has no answer guard")
    return policy.answer.rules


def _with_threshold(policy: Policy, threshold: Threshold, value: float) -> Policy | AnswerGuard:
    """The policy (or its answer guard) with the threshold at `value`: what is walked for each candidate."""
    walked: Policy | AnswerGuard = policy.answer if threshold.answer and policy.answer is not None else policy
    rules = list(walked.rules)
    rule = rules[threshold.rule_index]
    if rule.when is None:
        raise CalibrationError(f"rule {rule.name!r} has no condition to calibrate")
    when = rule.when[: threshold.start] + repr(value) + rule.when[threshold.end :]
    condition, _ = compile_condition(when, walked.questions)
    rules[threshold.rule_index] = dataclasses.replace(rule, when=when, condition=condition)
    return dataclasses.replace(walked, rules=tuple(rules))


def positive(label: Label, policy: Policy, rule: str, answer: bool = False) -> bool:
    """Whether `label` says the line belongs to `rule` (by name, or by where the rule sends it)."""
    if label.kind == "rule":
        return label.value == rule
    action = next(item.action for item in _rules(policy, answer) if item.name == rule)
    if label.kind == "block":
        return isinstance(action, Block)
    return isinstance(action, Route) and action.upstreams[0] == label.value


def curve(config: Config, threshold: Threshold, outcomes: Sequence[Outcome]) -> list[Point]:
    """Precision, recall, F1 and share at every threshold that changes a decision, plus the current one."""
    policy = config.policies[threshold.policy]
    lines = [o for o in outcomes if o.policy == threshold.policy and o.kind == threshold.lines
             and o.answers is not None and o.error is None]  # fmt: skip
    values = sorted({v for o in lines if o.answers and (v := value_of(threshold.name, o.answers)) is not None})
    candidates = {threshold.value}
    if values:
        candidates |= {round(values[0] - 0.01, 4), round(values[-1] + 0.01, 4)}
        candidates |= {round((a + b) / 2, 4) for a, b in itertools.pairwise(values)}
    points = []
    for value in sorted(candidates):
        changed = _with_threshold(policy, threshold, value)
        tp = fp = fn = taken = 0
        for outcome in lines:
            fires = changed.evaluate(outcome.answers or {}).rule == threshold.rule  # lines with answers only
            taken += fires
            label = outcome.line.label
            if label is None:
                continue
            truth = positive(label, policy, threshold.rule, threshold.answer)
            tp += fires and truth
            fp += fires and not truth
            fn += truth and not fires
        precision = tp / (tp + fp) if tp + fp else None
        recall = tp / (tp + fn) if tp + fn else None
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
        points.append(Point(value, precision, recall, f1, taken / len(lines) if lines else 0.0, tp, fp, fn))
    return points


def pick(points: Sequence[Point], target: Target, level: float | None = None, current: float = 0.0) -> Point:
    """The threshold meeting `target`: best F1; the best precision with recall >= level; the best recall with
    share <= level. Ties go to the threshold nearest the current one."""
    if target == "best-f1":
        fit = [p for p in points if p.f1 is not None]
        key = lambda p: (p.f1 or 0.0, p.precision or 0.0, -abs(p.threshold - current))  # noqa: E731
    elif level is None:
        raise CalibrationError(f"the target {target!r} needs a level")
    elif target == "min-recall":
        fit = [p for p in points if p.recall is not None and p.recall >= level - 1e-12]
        key = lambda p: (p.precision or 0.0, p.f1 or 0.0, -abs(p.threshold - current))  # noqa: E731
    else:
        fit = [p for p in points if p.share <= level + 1e-12]
        key = lambda p: (p.recall or 0.0, p.precision or 0.0, -abs(p.threshold - current))  # noqa: E731
    if not fit:
        wanted = {"best-f1": "any labelled line of the rule", "min-recall": f"recall >= {level:g}",
                  "max-share": f"share <= {level:g}"}[target]  # fmt: skip
        raise CalibrationError(f"no threshold meets {wanted} on this traffic")
    return max(fit, key=key)


def write_threshold(config: Config, threshold: Threshold, value: float, out: str) -> Config:
    """Copy the configuration file to `out` with the threshold changed in place (comments kept); validate it."""
    with open(config.file, encoding="utf-8") as handle:
        text = handle.read()
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    span = _when_span(node, threshold)
    if span is None:
        raise CalibrationError(f"cannot find the `when` of rule {threshold.rule!r} in {config.file}")
    matches = list(_COMPARISON.finditer(text, span[0], span[1]))
    if threshold.index >= len(matches):
        raise CalibrationError(f"cannot find {threshold.text!r} as written in {config.file}; edit it by hand")
    match = matches[threshold.index]
    edited = text[: match.start("number")] + f"{value:g}" + text[match.end("number") :]
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(edited)
    try:
        return load_config(out)
    except ConfigError as exc:
        raise CalibrationError(f"the edited copy {out} does not load: {exc.issues[0]}") from None


def _when_span(root: yaml.Node | None, threshold: Threshold) -> tuple[int, int] | None:
    node = root
    path = ("answer", "rules") if threshold.answer else ("rules",)
    for key in ("policies", threshold.policy, *path, threshold.rule_index, "when"):
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            return None
    return (node.start_mark.index, node.end_mark.index) if isinstance(node, yaml.ScalarNode) else None
