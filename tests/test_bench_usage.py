"""The router benchmark's usage rows (issue 29, benchmarks/_usagerows.py): their configurations turn usage and
budgets on and off as named, the canned upstream sends the usage chunk only when asked, the summary sets each row
against its base; one quick run for real, the Redis row against a redis-server of the benchmark's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import _keyrows, _usagerows
from benchmarks._answers import ANSWERS, CHAT_USAGE_CHUNK
from benchmarks._proxy import bench_config
from policies import parse_config
from tests._bench import bench, require_redis_server

UPSTREAM = "http://127.0.0.1:9/v1"

require_redis_server()  # a missing install is a failure to see, never a silent skip


def test_the_budget_rows_configuration_counts_and_never_refuses() -> None:
    server = parse_config(_keyrows.with_auth(bench_config(UPSTREAM, "off"), "budget")).server
    assert server.auth is not None
    key, group = server.auth.keys[0], server.auth.groups["bench"]
    assert key.group == "bench" and key.budget is not None and key.budget.tokens == 10**15
    assert group.token_rate is not None and group.token_rate.tokens == 10**15 and group.budget is not None


def test_the_canned_stream_has_a_usage_chunk_before_done_only_to_ask_for() -> None:
    chunks = ANSWERS[b"/chat/completions"][1]
    assert CHAT_USAGE_CHUNK not in chunks and chunks[-1] == b"data: [DONE]\n\n"
    assert json.loads(CHAT_USAGE_CHUNK[6:])["usage"]["completion_tokens"] == 5


def test_the_summary_sets_each_row_against_its_base() -> None:
    def row(target: str, concurrency: int, p50: float, cpu: float, errors: int = 0) -> dict[str, Any]:
        return {"target": target, "concurrency": concurrency, "p50 ms": p50, "CPU ms/req": cpu, "errors": errors}

    rows = [row(_usagerows.OFF, 1, 0.60, 0.400), row(_usagerows.ON, 1, 0.62, 0.410),
            row(f"stream, {_usagerows.OFF}", 8, 2.0, 0.5), row(f"stream, {_usagerows.ON}", 8, 2.5, 0.55),
            row(_usagerows.REDIS, 1, 0.95, 0.6, errors=2)]  # fmt: skip
    lines = _usagerows.vs_off(rows)
    assert (
        lines[f"usage: {_usagerows.ON}"]
        == f"{_usagerows.ON} over {_usagerows.OFF}: c=1: p50 +0.020 ms, CPU +10.0 us/req"
    )
    assert lines[f"usage: stream, {_usagerows.ON}"].endswith("c=8: p50 +0.500 ms, CPU +50.0 us/req")
    assert lines[f"usage: {_usagerows.REDIS}"].endswith("c=1: p50 +0.330 ms, CPU +190.0 us/req; 2 errors")
    assert f"usage: {_usagerows.BUDGET}" not in lines  # no row measured: no line


def test_a_chosen_row_brings_its_base() -> None:
    assert _usagerows._chosen(["in Redis"]) == [_usagerows.ON, _usagerows.REDIS]
    assert _usagerows._chosen(["usage counted"]) == [_usagerows.OFF, _usagerows.ON]
    assert _usagerows._chosen(["sessions"]) == []


def test_the_usage_rows_run_and_count_what_they_say(tmp_path: Path) -> None:
    completed = bench(tmp_path, "--only", "d3router usage")
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads((tmp_path / "router.json").read_text())["rows"]
    names = {*_usagerows.ROWS, *(f"stream, {name}" for name in _usagerows.ROWS)}
    assert {row["target"] for row in rows} == {"direct", *names}
    for row in rows:
        assert row["errors"] == 0 and row["requests"] > 0, row
    calls = json.loads((tmp_path / "router-extra.json").read_text())["engine_calls"]
    for prefix in ("", "stream, "):
        assert calls[prefix + _usagerows.OFF]["upstream_tokens"] == 0, "count_usage: false reads nothing"
        for name in (_usagerows.ON, _usagerows.BUDGET, _usagerows.REDIS):
            assert calls[prefix + name]["upstream_tokens"] > 0, prefix + name  # streams: the asked usage chunk
        assert calls[prefix + _usagerows.REDIS]["budgets"] == "RedisBudgets"
        redis_row = calls[prefix + _usagerows.REDIS]  # Redis kept the budgets: fewer fallbacks than requests (see
        assert redis_row["redis_fallbacks"] < redis_row["answered_requests"], redis_row  # test_bench_keys.py)
        assert calls[prefix + _usagerows.BUDGET]["budgets"] == "Budgets"
    summary = json.loads((tmp_path / "router-extra.json").read_text())["usage"]
    assert set(summary) == {f"usage: {p}{n}" for p in ("", "stream, ") for n in (_usagerows.ON, _usagerows.BUDGET,
                                                                                   _usagerows.REDIS)}  # fmt: skip
