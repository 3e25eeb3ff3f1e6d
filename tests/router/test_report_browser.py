"""`replay --html` in a real headless browser (Debian's chromium driven by playwright): the page loads without a
console error or a network request, and shows the figures the JSON report says.

Needs `chromium` (apt) and `playwright` (the test extra); `.ci/setup` installs both. Never `playwright install`:
the browser is the system's. In CI (`CI` set) a missing browser fails this test instead of skipping it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from d3backend import FakeEngine
from policies import load_config
from router._offline.calibrate import curve, find_threshold, pick
from router._offline.replay import read_traffic, replay
from router._offline.report import fmt, summarize
from router._offline.report_html import html_page
from tests.router.test_replay import CONFIG, answers_from_text, files

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def require_browser() -> None:
    missing = []
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        missing.append("chromium (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("playwright (pip install -e '.[test]')")
    if missing:
        message = f"the browser test needs {' and '.join(missing)}: run `bash .ci/setup`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def report(tmp_path: Path) -> dict[str, Any]:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    (tmp_path / "new.yaml").write_text(CONFIG.replace("jailbreak > 0.9", "jailbreak > 0.8"), encoding="utf-8")
    other = load_config(tmp_path / "new.yaml")
    lines, bad = read_traffic(traffic, config)
    before = asyncio.run(replay(config, lines, engine=FakeEngine(answers_from_text)))
    after = asyncio.run(replay(other, lines, engine=FakeEngine(answers_from_text)))
    threshold = find_threshold(config, "auto", rule="refuse-jailbreak")
    points = curve(config, threshold, before)
    chosen = pick(points, "best-f1", current=threshold.value)
    return summarize(config, before, bad, against=(other, after), calibration=(threshold, points, chosen))


def test_the_page_shows_what_the_json_says(tmp_path: Path) -> None:
    require_browser()
    from playwright.sync_api import sync_playwright

    data = report(tmp_path)
    page_file = tmp_path / "report.html"
    page_file.write_text(html_page(data), encoding="utf-8")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_file.as_uri(), wait_until="load")
            text = {ident: page.inner_text(f"#{ident}") for ident in ("accuracy", "block-rate", "decided", "lines")}
            cells = page.eval_on_selector_all(
                "#confusion-rule td.heat",
                "cells => cells.map(c => [c.dataset.actual, c.dataset.predicted, c.textContent, c.title])",
            )
            per_rule = page.eval_on_selector_all(
                "#per-rule tr[data-name]",
                "rows => rows.map(r => [r.dataset.name, r.querySelector('.count').textContent])",
            )
            changed_count = page.inner_text("#changed-count")
            changed_lines = page.eval_on_selector_all(
                "#changed-lines tr[data-line]", "rows => rows.map(r => r.dataset.line)"
            )
            series = page.eval_on_selector_all("#calibration polyline", "lines => lines.map(l => l.points.length)")
            chosen = page.get_attribute("#chosen", "data-threshold")
            embedded = page.evaluate("JSON.parse(document.getElementById('d3-report').textContent).accuracy")
            visible = page.is_visible("#calibration") and page.is_visible("#confusion-rule")
        finally:
            browser.close()
    assert errors == []
    assert requests == [page_file.as_uri()]  # nothing fetched beyond the page itself
    assert text == {"accuracy": fmt(data["accuracy"]), "block-rate": fmt(data["block_rate"]),
                    "decided": str(data["decided"]), "lines": str(data["lines"])}  # fmt: skip
    table = data["confusion"]["rule"]
    expected = [
        [actual, guess, str(table["matrix"][i][j]), f"{actual} labelled, decided {guess}: {table['matrix'][i][j]}"]
        for i, actual in enumerate(table["classes"])
        for j, guess in enumerate(table["classes"])
    ]
    assert cells == expected  # the script ran: every cell got its tooltip
    assert per_rule == [[rule, str(n)] for rule, n in data["per_rule"].items()]
    assert changed_count == str(data["changed"]["count"]) == "1"
    assert changed_lines == [str(item["line"]) for item in data["changed"]["lines"]] == ["2"]
    points = data["calibration"]["points"]
    assert series == [sum(p[key] is not None for p in points) for key in ("precision", "recall", "f1", "share")]
    assert series == [10, 11, 11, 11]  # no precision where nothing fires
    assert chosen is not None and float(chosen) == data["calibration"]["chosen"]["threshold"] == 0.675
    assert embedded == data["accuracy"] and visible
