"""What replayed traffic costs (issue 29.3): each decided line's tokens at the price of the upstream its replayed
decision sends it to, against a reference route (`--reference large`: all of the traffic to `large`).

    figures = costs(config, outcomes, reference="large")   # the report's `cost`, or None when nothing is priced

A line's tokens are the ones its upstream reported: a decision-log line's `usage` (written since issue 29.2), or a
labelled line's own `usage`. A line without them is counted on its input alone, estimated from its text as the
`request.tokens` fact is (router/_apis/facts.py), and said so (`estimated`): its output is unknown.

The same tokens are priced on every route, which is the estimate's limit: another model answers at another length
(and tokenizes otherwise). A blocked line costs nothing under the policy; under the reference it would have been
answered, so the saving counts what the blocks saved too. An upstream without `price` counts nothing and is named
(`unpriced`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from policies import Config
from router._apis.facts import estimate_tokens
from router._observe.usage import Tokens, cost
from router._offline.replay import Outcome, TrafficLine


def line_tokens(line: TrafficLine) -> tuple[Tokens, bool]:
    """The line's tokens, and whether they were reported (else: its input estimated, its output unknown)."""
    if line.usage is not None:
        return line.usage, True
    texts: list[str] = []
    _texts(line.body.get("messages") or line.body.get("input") or line.body.get("prompt"), texts)
    return Tokens(input=estimate_tokens("\n".join(texts), len(texts)), reported=True), False


def _texts(value: Any, out: list[str]) -> None:
    """Every string inside `value` (message contents, parts, prompts), in order."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for item in value:
            _texts(item, out)
    elif isinstance(value, Mapping):
        for key in ("content", "text", "input", "output"):
            if key in value:
                _texts(value[key], out)


def costs(config: Config, outcomes: Sequence[Outcome], reference: str | None = None) -> dict[str, Any] | None:
    """The replay's cost figures; None when no upstream has a price and no reference is asked."""
    priced = {name for name, up in config.upstreams.items() if up.price is not None}
    if not priced and reference is None:
        return None
    decided = [o for o in outcomes if o.kind == "request" and o.policy is not None]
    total = Tokens(reported=True)
    per_upstream: dict[str, float] = {}
    unpriced: Counter[str] = Counter()
    policy_cost = reference_cost = logged = 0.0
    estimated = logged_lines = 0
    ref_price = config.upstreams[reference].price if reference is not None else None
    for outcome in decided:
        tokens, reported = line_tokens(outcome.line)
        estimated += not reported
        total = Tokens(total.input + tokens.input, total.cached + tokens.cached, total.output + tokens.output, True)
        if outcome.upstream is not None:
            spent = cost(tokens, config.upstreams[outcome.upstream].price)
            if spent is None:
                unpriced[outcome.upstream] += 1
            else:
                policy_cost += spent
                per_upstream[outcome.upstream] = per_upstream.get(outcome.upstream, 0.0) + spent
        reference_cost += cost(tokens, ref_price) or 0.0
        if outcome.line.logged_cost is not None:
            logged, logged_lines = logged + outcome.line.logged_cost, logged_lines + 1
    figures: dict[str, Any] = {
        "lines": len(decided),
        "estimated": estimated,
        "tokens": {"input": total.input, "cached": total.cached, "output": total.output},
        "policy": policy_cost,
        "per_upstream": dict(sorted(per_upstream.items(), key=lambda item: -item[1])),
        "unpriced": dict(unpriced.most_common()),
        "logged": logged if logged_lines else None,
    }
    if reference is not None:
        saving = reference_cost - policy_cost
        figures["reference"] = {
            "upstream": reference,
            "cost": reference_cost,
            "saving": saving,
            "saving_share": saving / reference_cost if reference_cost else None,
        }
    return figures


def reference_problem(config: Config, reference: str) -> str | None:
    """Why `reference` cannot be the reference route, or None."""
    if reference not in config.upstreams:
        known = ", ".join(config.upstreams) or "none"
        return f"--reference {reference!r} is not an upstream of {config.file}; upstreams: {known}"
    if config.upstreams[reference].price is None:
        return f"--reference {reference!r} has no `price`: set upstreams.{reference}.price to compare costs"
    return None


def money(value: float | None) -> str:
    """A cost as the report prints it: enough digits for a fraction of a cent."""
    return "-" if value is None else f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
