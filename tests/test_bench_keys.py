"""The router benchmark's client-key rows (issue 25, benchmarks/_keyrows.py): their configurations really turn keys
and rate limits on, the load generator sends the key, the summary sets each row against its base; one quick run for
real, the Redis row against a redis-server of the benchmark's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from benchmarks import _keyrows
from benchmarks._proxy import SALT_ENV, bench_config
from d3backend import FakeEngine
from policies import parse_config
from router import create_app
from tests._bench import bench, require_redis_server

UPSTREAM = "http://127.0.0.1:9/v1"

require_redis_server()  # a missing install is a failure to see, never a silent skip


def test_the_rows_configurations() -> None:
    assert _keyrows.with_auth(bench_config(UPSTREAM), "off") == bench_config(UPSTREAM)  # the plain row's, as it was
    keys = parse_config(_keyrows.with_auth(bench_config(UPSTREAM, "off"), "keys")).server
    assert keys.auth is not None and [(k.name, k.key_env, k.rate) for k in keys.auth.keys] == [
        ("bench", _keyrows.KEY_ENV, None)]  # fmt: skip
    assert keys.redis is None
    rate = parse_config(_keyrows.with_auth(bench_config(UPSTREAM, "off"), "rate", "redis://127.0.0.1:1/0")).server
    assert rate.auth is not None and rate.auth.keys[0].rate is not None and rate.auth.keys[0].group == "bench"
    assert rate.auth.groups["bench"].rate is not None and rate.auth.groups["bench"].rate.requests == 10**9
    assert (rate.redis, rate.sessions.salt_env) == ("redis://127.0.0.1:1/0", SALT_ENV)  # refused without a salt
    both = parse_config(_keyrows.with_auth(bench_config(UPSTREAM, "redis://127.0.0.1:2/0"), "keys")).server
    assert both.auth is not None and both.redis == "redis://127.0.0.1:2/0"  # the sessions' server line merged
    with pytest.raises(SystemExit, match="--auth: expected off, keys, rate or budget"):
        _keyrows.with_auth(bench_config(UPSTREAM), "jwt")


@pytest.mark.anyio
async def test_a_keys_row_refuses_a_request_without_the_benchmarks_key() -> None:
    config = parse_config(_keyrows.with_auth(bench_config("http://up.test/v1", "off"), "rate"))
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    name, _, value = _keyrows.HEADER.partition(": ")
    with respx.mock() as mock:
        mock.post("http://up.test/v1/chat/completions").respond(200, json={"ok": True})
        app = create_app(config, engine=FakeEngine(), transport=httpx.AsyncHTTPTransport(), environ=_keyrows.ENVIRON)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as http:
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 401
            statuses = {(await http.post("/v1/chat/completions", json=body, headers={name: value})).status_code
                        for _ in range(50)}  # fmt: skip
        await app.aclose()
    assert statuses == {200}  # counted, never limited


def test_the_summary_sets_each_row_against_its_base() -> None:
    def row(target: str, concurrency: int, p50: float, cpu: float, errors: int = 0) -> dict[str, Any]:
        return {"target": target, "concurrency": concurrency, "p50 ms": p50, "CPU ms/req": cpu, "errors": errors}

    rows = [row(_keyrows.OFF, 1, 0.60, 0.400), row(_keyrows.OFF, 8, 2.0, 0.300),
            row(_keyrows.KEYS, 1, 0.61, 0.405), row(_keyrows.KEYS, 8, 2.1, 0.320),
            row(_keyrows.RATE, 1, 0.63, 0.41), row(_keyrows.REDIS, 1, 0.95, 0.6, errors=2)]  # fmt: skip
    lines = _keyrows.vs_auth(rows)
    assert lines[f"keys: {_keyrows.KEYS}"].endswith(
        "adds CPU ms/req +0.005, +0.020 over d3router auth off (cache hit, a credential sent) at c=1/8; "
        "target <= 10 us (MISSED)")  # fmt: skip
    assert "adds p50 ms +0.020 over d3router auth keys (cache hit) at c=1; target <= 0.05 ms at c=1 (met)" in lines[
        f"keys: {_keyrows.RATE}"]  # fmt: skip
    assert lines[f"keys: {_keyrows.REDIS}"].endswith("target <= 0.3 ms at c=1 (MISSED); 2 errors")
    assert _keyrows.vs_auth([row(_keyrows.RATE, 1, 0.6, 0.4)]) == {}  # no base measured: no line
    floor = {"get": 0.2, "rate": 0.1, "rate_cpu": 0.05, "rate_redis_py": 0.25, "rate_redis_py_cpu": 0.18}
    floored = _keyrows.vs_auth(rows, floor)
    assert floored[f"keys: {_keyrows.REDIS}"].endswith(
        "; 2 errors; one round trip of its script at c=1: 0.100 ms p50, 0.050 ms CPU (from redis-py: 0.250 ms, "
        "0.180 ms CPU; a GET's: 0.200 ms)"
    )
    assert floored[f"keys: {_keyrows.RATE}"] == lines[f"keys: {_keyrows.RATE}"]  # the floor is the Redis row's only
    costs = {"caller, auth off": 3.4, "caller, auth keys": 2.1, "rate limit in process": 61.0,
             "request, auth off": 300.0, "request, auth keys": 311.5}  # fmt: skip
    alone = _keyrows.vs_auth(rows, None, costs)
    assert alone[f"keys: {_keyrows.KEYS}"].endswith(
        "(MISSED); measured alone: the caller found in 2.1 us with keys on, 3.4 us off: -1.3 us (met); a whole "
        "request in process, 311.5 us of CPU with keys on, 300.0 us off: +11.5 us (MISSED)"
    )
    assert alone[f"keys: {_keyrows.RATE}"].endswith("(met); measured alone: 61.0 us a request (MISSED)")
    assert alone[f"keys: {_keyrows.REDIS}"] == lines[f"keys: {_keyrows.REDIS}"]


def test_base_rows_come_with_the_rows_set_against_them() -> None:
    assert _keyrows.base(["in Redis"], _keyrows.KEYS) and not _keyrows.base(["in Redis"], _keyrows.OFF)
    assert _keyrows.base(["auth keys (cache"], _keyrows.OFF)
    assert not _keyrows.base(["sessions"], _keyrows.KEYS)
    assert _keyrows.headers(_keyrows.REDIS) == (_keyrows.HEADER,) and _keyrows.headers("d3router cache hit") == ()


def test_the_key_rows_run_with_no_errors(tmp_path: Path) -> None:
    completed = bench(tmp_path, "--only", "d3router auth")
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads((tmp_path / "router.json").read_text())["rows"]
    assert {row["target"] for row in rows} == {"direct", *_keyrows.ROWS}
    for row in rows:
        assert row["errors"] == 0 and row["requests"] > 0, row  # a key not sent would be 401s
    extra = json.loads((tmp_path / "router-extra.json").read_text())
    limiters = {name: extra["engine_calls"][name].get("limiter") for name in _keyrows.ROWS}
    assert limiters == {_keyrows.OFF: None, _keyrows.KEYS: "Limiter", _keyrows.RATE: "Limiter",
                        _keyrows.REDIS: "RedisLimiter"}  # fmt: skip
    # Redis kept the limits: a limiter that never reached it would fall back for every request it let through. Not
    # none: one call slower than the 50 ms timeout on a loaded machine opens the breaker, and the process counts
    # alone for a second. (Requests refused before the limits, such as the start's keyless check, do not count.)
    redis_row = extra["engine_calls"][_keyrows.REDIS]
    assert redis_row["redis_fallbacks"] < redis_row["answered_requests"], redis_row
    assert "streaming" not in extra  # the c=1 streaming section is not asked for by `--only "d3router auth"`
    assert set(extra["keys"]) == {f"keys: {name}" for name in (_keyrows.KEYS, _keyrows.RATE, _keyrows.REDIS)}
    costs = extra["key costs"]  # the checks measured alone, in microseconds
    assert set(costs) == {"caller, auth off", "caller, auth keys", "rate limit in process", "request, auth off",
                          "request, auth keys"}, costs  # fmt: skip
    # microseconds, not seconds or nanoseconds: bounds a loaded machine stays far inside (1.2 ms a request seen)
    assert all(0.1 < value < 100_000 for value in costs.values()), costs
    assert costs["caller, auth keys"] < costs["request, auth keys"], costs  # the caller is a part of the request
    assert costs["caller, auth off"] < costs["request, auth off"], costs
    assert "; measured alone: " in extra["keys"][f"keys: {_keyrows.RATE}"]
    assert f"{costs['request, auth keys']:.1f} us of CPU with keys on" in extra["keys"][f"keys: {_keyrows.KEYS}"]
    floor = extra["redis floor"]  # measured against the same redis-server, beside the rows
    names = {"get", "rate", "rate_redis_py"}
    assert set(floor) == names | {f"{name}_cpu" for name in names} and all(0 < value < 500 for value in floor.values())
    assert f"its script at c=1: {floor['rate']:.3f} ms p50" in extra["keys"][f"keys: {_keyrows.REDIS}"]
