"""Tokens and cost of upstream answers (issue 29.2-3): counted per caller, policy, rule and upstream in the metrics,
and written into each request's decision-log line.

    tokens = Tokens(input=120, cached=64, output=30, reported=True)      # router/_apis/usage.py reads them
    accounting = Accounting(metrics)
    accounting.count(Spent("alice", "team-a", "auto", "default", "small", tokens, cost(tokens, price)))

The tokens are what the upstream reported (its usage), never an estimate: an answer that reports none is counted
as such (`d3router_upstream_usage_unreported_total`), with no tokens. Cost is the upstream's `price` (per million
tokens, one currency of the user's) times those tokens; no price, no cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies import PriceSpec
from router._observe.metrics import Counts, Metrics

PER = 1_000_000  # prices are per million tokens


@dataclass(slots=True)
class Tokens:
    """One answer's tokens as its upstream reported them: input (of which `cached`, read from a prompt cache) and
    output; `reported` False when the answer carried no usage."""

    input: int = 0
    cached: int = 0
    output: int = 0
    reported: bool = False

    @property
    def total(self) -> int:
        return self.input + self.output

    def json(self) -> dict[str, int] | None:
        """The decision log's `usage`: None when the answer reported none."""
        if not self.reported:
            return None
        return {"input": self.input, "cached": self.cached, "output": self.output}


def cost(tokens: Tokens, price: PriceSpec | None) -> float | None:
    """What `tokens` cost at `price` (None without a price or without reported tokens)."""
    if price is None or not tokens.reported:
        return None
    cached = min(tokens.cached, tokens.input)
    cached_price = price.input if price.cached_input is None else price.cached_input
    return ((tokens.input - cached) * price.input + cached * cached_price + tokens.output * price.output) / PER


@dataclass(frozen=True, slots=True)
class Spent:
    """One answer's tokens and cost, and whose they are: the key's name and group ("" for none), the policy, the rule
    and the upstream."""

    key: str
    group: str
    policy: str
    rule: str
    upstream: str
    tokens: Tokens
    cost: float | None = None

    def log_fields(self) -> dict[str, Any]:
        """What the decision-log line gets: the upstream that answered, its usage (None: not reported), its cost."""
        fields: dict[str, Any] = {"upstream": self.upstream, "usage": self.tokens.json()}
        if self.cost is not None:
            fields["cost"] = round(self.cost, 9)
        return fields


class Accounting:
    """The usage families of one `Metrics` (made once, with the app). Label values: key and group names (from the
    configuration; `-` for an anonymous caller, never its hash), policy, rule and upstream names."""

    def __init__(self, metrics: Metrics) -> None:
        labels = ("key", "group", "policy", "rule", "upstream")
        self.tokens: Counts[tuple[str, ...]] = metrics.counter(
            "d3router_upstream_tokens",
            "Tokens of upstream answers as the upstreams reported them (kind: input, cached (of input), output), by "
            "client key, group, policy, rule and upstream.",
            (*labels, "kind"),
        )
        self.cost: Counts[tuple[str, ...]] = metrics.counter(
            "d3router_upstream_cost",
            "Cost of upstream answers (upstreams.NAME.price per million tokens, in its currency), by client key, "
            "group, policy, rule and upstream.",
            labels,
        )
        self.unreported: Counts[str] = metrics.counter(
            "d3router_upstream_usage_unreported",
            "Upstream answers that reported no usage (not counted in tokens), by upstream.",
            ("upstream",),
        )

    def count(self, spent: Spent) -> None:
        tokens = spent.tokens
        if not tokens.reported:
            self.unreported[spent.upstream] += 1
            return
        key = (spent.key or "-", spent.group or "-", spent.policy, spent.rule, spent.upstream)
        self.tokens[(*key, "input")] += tokens.input
        self.tokens[(*key, "cached")] += tokens.cached
        self.tokens[(*key, "output")] += tokens.output
        if spent.cost is not None:
            self.cost[key] += spent.cost
