"""`d3router replay` prices the replayed routes and the saving against a reference route (issue 29.3): exact sums
from each line's tokens at each upstream's price, logged usage read back, estimated lines said, the reference
checked, the Markdown, the JSON and the HTML page (in a real headless browser) showing the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from d3backend import FakeEngine
from router._cli.main import main
from tests.router.test_report_browser import ARGS, CHROMIUM, require_browser

CONFIG = """
server: {default_policy: auto}
upstreams:
  small: {url: http://127.0.0.1:9/v1, price: {input: 1.0, output: 2.0}}
  large: {url: http://127.0.0.1:9/v1, price: {input: 10.0, cached_input: 1.0, output: 30.0}}
  free: {url: http://127.0.0.1:9/v1}
policies:
  auto:
    questions: {hard: {type: noul}, bad: {type: noul}}
    rules:
      - {name: refuse, when: bad > 0.5, block: {status: 403, message: no}}
      - {name: hard, when: hard > 0.5, route: large}
      - {name: default, route: small}
"""
M = 1e6


def engine() -> FakeEngine:
    """`hard` and `bad` read from the text."""

    def table(state: Any, questions: Any) -> dict[str, float]:
        text = json.dumps(state)
        return {"hard": 0.9 if "hard" in text else 0.1, "bad": 0.9 if "bad" in text else 0.1}

    return FakeEngine(table)


def line(text: str, usage: dict[str, int] | None = None) -> str:
    data: dict[str, Any] = {"request": {"model": "auto", "messages": [{"role": "user", "content": text}]}}
    if usage is not None:
        data["usage"] = usage
    return json.dumps(data) + "\n"


LOGGED = {"time": 1.0, "request_id": "r1", "policy": "auto", "rule": "default", "upstream": "small",
          "state_from": "last_user", "state": "a logged easy one", "usage": {"input": 100, "cached": 0, "output": 50},
          "cost": 0.0002}  # fmt: skip
TRAFFIC = (
    line("an easy one", {"input": 1000, "cached": 0, "output": 500})  # small: 1000 + 1000 = 2000 / M
    + line("a hard one", {"input": 2000, "cached": 1000, "output": 100})  # large: 10000 + 1000 + 3000 = 14000 / M
    + line("a bad one", {"input": 300, "cached": 0, "output": 10})  # blocked: 0; under large 3000 + 300 = 3300 / M
    + json.dumps(LOGGED)
    + "\n"  # small: 100 + 100 = 200 / M; under large 1000 + 1500 = 2500 / M
)
POLICY = (2000 + 14000 + 200) / M
REFERENCE = (10000 + 15000 + 14000 + 3300 + 2500) / M


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    async def _open(config: Any) -> FakeEngine:
        return engine()

    monkeypatch.setattr("router._offline.commands._open", _open)
    (tmp_path / "router.yaml").write_text(CONFIG, encoding="utf-8")
    (tmp_path / "traffic.jsonl").write_text(TRAFFIC, encoding="utf-8")
    return str(tmp_path / "router.yaml"), str(tmp_path / "traffic.jsonl")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_json_prices_each_route_and_the_saving(files: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *files, "--reference", "large", "--json")
    assert code == 0
    spent = json.loads(out)["cost"]
    assert spent["lines"] == 4 and spent["estimated"] == 0
    assert spent["tokens"] == {"input": 3400, "cached": 1000, "output": 660}
    assert spent["policy"] == pytest.approx(POLICY)
    assert spent["per_upstream"] == pytest.approx({"large": 14000 / M, "small": 2200 / M})
    assert spent["logged"] == pytest.approx(0.0002), "the logged cost of the decision-log line"
    ref = spent["reference"]
    assert ref["upstream"] == "large" and ref["cost"] == pytest.approx(REFERENCE)
    assert ref["saving"] == pytest.approx(REFERENCE - POLICY)
    assert ref["saving_share"] == pytest.approx((REFERENCE - POLICY) / REFERENCE)


def test_a_line_without_usage_is_estimated_and_an_unpriced_route_named(
    tmp_path: Path, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    config, traffic = files
    Path(config).write_text(CONFIG.replace("route: small}", "route: free}"), encoding="utf-8")
    Path(traffic).write_text(line("hard " * 400) + line("an easy one", {"input": 5, "cached": 0, "output": 5}))
    code, out, _ = run(capsys, config, traffic, "--json")
    spent = json.loads(out)["cost"]
    assert code == 0 and spent["estimated"] == 1 and "reference" not in spent
    assert 350 < spent["tokens"]["input"] - 5 < 650 and spent["tokens"]["output"] == 5, "input estimated, no output"
    assert spent["policy"] == pytest.approx((spent["tokens"]["input"] - 5) * 10 / M)
    assert spent["unpriced"] == {"free": 1}


def test_nothing_priced_no_cost_section(files: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    config, traffic = files
    Path(config).write_text("\n".join(ln.split(", price")[0] + "}" if "price" in ln else ln
                                      for ln in CONFIG.splitlines()))  # fmt: skip
    code, out, _ = run(capsys, config, traffic, "--json")
    assert code == 0 and "cost" not in json.loads(out)


@pytest.mark.parametrize(("name", "says"), [("huge", "is not an upstream"), ("free", "has no `price`")])
def test_a_reference_that_cannot_be_priced_is_refused(
    files: tuple[str, str], capsys: pytest.CaptureFixture[str], name: str, says: str
) -> None:
    code, out, err = run(capsys, *files, "--reference", name)
    assert code == 2 and out == "" and says in err


def test_a_bad_usage_is_a_skipped_line(files: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    config, traffic = files
    Path(traffic).write_text(line("an easy one", {"input": -1, "cached": 0, "output": 5}) + line("fine"))
    code, out, err = run(capsys, config, traffic, "--json")
    assert code == 0 and json.loads(out)["decided"] == 1 and "`usage` must be" in err


def test_the_markdown_says_the_cost_and_the_saving(files: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *files, "--reference", "large")
    assert code == 0
    assert "## Cost: 0.0162 on the replayed routes" in out
    assert (
        f"**Saving {REFERENCE - POLICY:.4f}** ({(REFERENCE - POLICY) / REFERENCE:.3f} of it) against all traffic to large (0.0448)"
        in out
    )


def test_the_html_page_shows_the_cost_and_the_saving(
    tmp_path: Path, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    require_browser()
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "report.html"
    code, out, _ = run(capsys, *files, "--reference", "large", "--json", "--html", str(page_file))
    spent = json.loads(out)["cost"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(page_file.as_uri(), wait_until="load")
            shown = {ident: page.inner_text(f"#{ident}") for ident in
                     ("cost-policy", "cost-saving", "cost-saving-share", "cost-reference", "cost-estimated")}  # fmt: skip
            rows = page.eval_on_selector_all(
                "#cost-per-upstream tr[data-name]",
                "rows => rows.map(r => [r.dataset.name, r.querySelector('.cost').textContent])",
            )
            visible = page.is_visible("#cost-saving")
        finally:
            browser.close()
    assert code == 0 and visible
    assert shown == {"cost-policy": "0.0162", "cost-saving": f"{REFERENCE - POLICY:.4f}",
                     "cost-saving-share": f"{(REFERENCE - POLICY) / REFERENCE:.3f}", "cost-reference": "large", "cost-estimated": "0"}  # fmt: skip
    assert rows == [["large", "0.014"], ["small", "0.0022"]] and len(spent["per_upstream"]) == 2
