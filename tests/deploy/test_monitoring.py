"""The monitoring in deploy/ (issue 24.7): the Prometheus rules pass `promtool check rules` and their unit tests
(`promtool test rules`), and every metric the rules and the Grafana dashboard query is one the router exports, as
its real `/metrics` shows it (a renamed metric fails here, not on an operator's silent dashboard)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from policies import parse_config
from router import create_app

pytestmark = pytest.mark.anyio

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yaml"
DASHBOARD = DEPLOY / "grafana" / "d3router.json"

# Every optional part on (Redis, a remote engine, sessions, a shadow policy), so that each family is registered.
CONFIG = """
server: {redis: "redis://127.0.0.1:1/0", sessions: {salt_env: D3_SESSION_SALT}}
engine: {remote: {urls: ["http://d3.test:8000"]}}
upstreams: {small: {url: http://small.test/v1}}
policies:
  live:
    questions: {j: {type: noul}}
    shadow: next
    rules:
      - {name: guard, when: j > 0.9, block: {status: 403, message: no}}
      - {name: default, route: small}
  next:
    questions: {j: {type: noul}}
    rules:
      - {name: guard, when: j > 0.5, block: {status: 403, message: no}}
      - {name: default, route: small}
"""

# PromQL words that are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:  # a failure to see, never a skip: .ci/setup installs it
        pytest.fail("promtool is not installed; run `bash .ci/setup` (it installs Debian's prometheus)", pytrace=False)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, durations, groupings, strings and functions out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)  # Grafana's variables
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = _GROUPING.sub("", expr)
    return {name for name in _NAME.findall(expr) if name not in _KEYWORDS and not re.fullmatch(r"\d\w*", name)}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(re.sub(r"^label_values\((\w+),.*\)$", r"\1", variable["definition"]))
    return exprs


async def exported() -> set[str]:
    """The sample names of the router's `/metrics`: counters with `_total`, histograms with `_bucket`, `_count` and
    `_sum`, as a scrape shows them (families without a series yet included, from their `# TYPE` line)."""
    app = create_app(parse_config(CONFIG, "c.yaml"), environ={"D3_SESSION_SALT": "s"})
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            text = (await client.get("/metrics")).text
    finally:
        await app.aclose()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


def test_promtool_checks_the_rules() -> None:
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_alerts_fire_in_their_unit_tests() -> None:
    tested = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    fired = set(re.findall(r"alertname: (\w+)\s*\n\s*exp_alerts: \[\{", RULE_TESTS.read_text(encoding="utf-8")))
    assert fired == alerts  # each alert has a case where it fires


async def test_every_queried_metric_is_exported() -> None:
    names = await exported()
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    queried = {name for rule in rules() for name in metric_names(rule["expr"])}
    queried |= {name for expr in dashboard_exprs() for name in metric_names(expr)}
    assert queried - recorded - names == set()
    assert {"d3router_redis_down", "d3router_redis_busy_total", "d3router_requests_total"} <= queried


def test_metric_names_are_read_from_promql() -> None:
    expr = 'histogram_quantile(0.99, sum by (policy, le) (rate(d3router_decision_seconds_bucket{x="a b"}[5m]))) > 0.5'
    assert metric_names(expr) == {"d3router_decision_seconds_bucket"}
    assert metric_names("absent(up) or a:b:c > 2 * foo offset 1h") == {"up", "a:b:c", "foo"}
    assert metric_names('sum(rate(x_total{p=~"$policy"}[$__rate_interval])) / 2^30') == {"x_total"}
