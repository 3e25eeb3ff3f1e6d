"""The router benchmark's session rows (issue 12) and its optional peers (issue 15.4, benchmarks/_peers.py).

The session rows run for real, Redis included (a redis-server of the benchmark's own; .ci/setup installs it). The
peers (nginx, LiteLLM proxy) are never installed by the tests or CI: their configs are checked as text, and
`--peers` without them must stop with a message naming the install script, not a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import _peers, _sessionrows
from benchmarks._proxy import bench_config
from policies import parse_config
from tests._bench import bench, require_redis_server

IN_PROCESS, IN_REDIS, LATER_IN_PROCESS, LATER_IN_REDIS = _sessionrows.ROWS  # the session rows' names

require_redis_server()  # a missing install is a failure to see, never a silent skip


def test_session_rows_run_beside_the_cache_hit_row_with_no_errors(tmp_path: Path) -> None:
    completed = bench(tmp_path, "--only", "sessions")
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads((tmp_path / "router.json").read_text())["rows"]
    by_target: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_target.setdefault(row["target"], []).append(row)
    assert set(by_target) == {"direct", "d3router cache hit", *_sessionrows.ROWS}  # the plain row comes along
    for name in _sessionrows.ROWS:
        assert [row["concurrency"] for row in by_target[name]] == [1, 8]
        assert all(row["errors"] == 0 and row["requests"] > 0 for row in by_target[name]), name
        assert all(isinstance(row[_sessionrows.COLUMN], float) for row in by_target[name]), name
    extra = json.loads((tmp_path / "router-extra.json").read_text())
    calls = extra["engine_calls"]
    # The plain row has sessions off; the opening rows decide every request as a session's opening turn; the later
    # turns rows start their session once (in Redis it may be there already: the opening row's proxy wrote it) and
    # then read it on every turn (sticky).
    assert set(calls["d3router cache hit"]["sessions"]) == {"off"}
    for name in (IN_PROCESS, IN_REDIS):
        assert calls[name]["sessions"] == {"new": calls[name]["decided_requests"]}, name
    assert calls[LATER_IN_PROCESS]["sessions"] == {"new": 1, "sticky": calls[LATER_IN_PROCESS]["decided_requests"] - 1}
    later = calls[LATER_IN_REDIS]["sessions"]
    assert (
        later.get("new", 0) <= 1 and later.get("new", 0) + later["sticky"] == calls[LATER_IN_REDIS]["decided_requests"]
    )
    # Redis served the Redis rows: a store that never reached it would have fallen back on every call (each turn
    # makes one store call at least). Not a share: one Redis call slower than the 50 ms timeout on a loaded machine
    # opens the store's breaker, and the in-process store answers alone for the next second (RETRY_S).
    for name in (IN_REDIS, LATER_IN_REDIS):
        assert calls[name]["redis_fallbacks"] < calls[name]["decided_requests"], name
    assert calls[IN_PROCESS]["redis_fallbacks"] == calls[LATER_IN_PROCESS]["redis_fallbacks"] == 0
    assert set(extra["sessions"]) == set(_sessionrows.ROWS)
    table = (tmp_path / "router.md").read_text()
    assert f"- {IN_PROCESS}: adds p50 ms" in table and "target <= 0.05 ms at c=1" in table
    assert f"- {IN_REDIS}: adds p50 ms" in table and "target <= 0.3 ms at c=1" in table


def test_bench_config_sets_the_session_mode_and_the_store() -> None:
    upstream = "http://127.0.0.1:9/v1"
    assert parse_config(bench_config(upstream, "off")).policies["auto"].session.mode == "off"
    memory = parse_config(bench_config(upstream, "memory"))
    assert memory.policies["auto"].session.mode == "sticky" and memory.server.redis is None
    redis = parse_config(bench_config(upstream, "redis://127.0.0.1:6390/0"))
    assert redis.policies["auto"].session.mode == "sticky"
    assert redis.server.redis == "redis://127.0.0.1:6390/0"
    assert redis.server.sessions.salt_env == "D3_BENCH_SALT"  # server.redis is refused without a salt (issue 25.6)
    assert bench_config(upstream) == bench_config(upstream, None)  # no option: the policy as it was
    with pytest.raises(SystemExit, match="expected off, memory or a redis:// URL"):
        bench_config(upstream, "mongo://x")


def test_session_summary_sets_each_row_against_the_plain_row() -> None:
    def row(target: str, concurrency: int, p50: float, errors: int = 0) -> dict[str, Any]:
        return {"target": target, "concurrency": concurrency, "p50 ms": p50, "errors": errors}

    rows = [row("d3router cache hit", 1, 0.70), row("d3router cache hit", 8, 4.0), row(IN_PROCESS, 1, 0.74),
            row(IN_PROCESS, 8, 4.1), row(IN_REDIS, 1, 1.2, errors=3)]  # fmt: skip
    lines = _sessionrows.vs_cache_hit(rows, {IN_REDIS: {"redis_fallbacks": 7}})
    assert rows[2][_sessionrows.COLUMN] == pytest.approx(0.04)
    assert lines[IN_PROCESS].endswith("at c=1/8; target <= 0.05 ms at c=1 (met)")
    assert "+0.040, +0.100" in lines[IN_PROCESS]
    assert "target <= 0.3 ms at c=1 (MISSED); 3 errors; 7 store calls fell back" in lines[IN_REDIS]
    for each, cpu in zip(rows, (0.5, 0.4, 0.52, 0.41, 0.6), strict=True):
        each["CPU ms/req"] = cpu
    with_cpu = _sessionrows.vs_cache_hit(rows)
    assert "(met); CPU ms per request +0.020, +0.010" in with_cpu[IN_PROCESS]
    assert with_cpu[IN_REDIS].endswith("(MISSED); CPU ms per request +0.100; 3 errors")
    floored = _sessionrows.vs_cache_hit(rows, None, {"get": 0.21, "rate": 0.3})
    assert floored[IN_REDIS].endswith("; 3 errors; one GET's round trip from redis-py at c=1: 0.210 ms p50")
    assert floored[IN_PROCESS] == with_cpu[IN_PROCESS]  # no floor under an in-process row


def test_nginx_config_is_one_worker_with_keepalive_upstreams_and_no_buffering(tmp_path: Path) -> None:
    text = _peers.nginx_config(tmp_path, 8123, "http://127.0.0.1:9001/v1", as_root=False)
    for line in ("worker_processes 1;", "daemon off;", "listen 127.0.0.1:8123;", "server 127.0.0.1:9001;",
                 "keepalive 128;", "proxy_pass http://fake;", "proxy_http_version 1.1;",
                 'proxy_set_header Connection "";', "proxy_buffering off;", "access_log off;",
                 f"pid {tmp_path / 'nginx.pid'};", f"proxy_temp_path {tmp_path / 'proxy'};"):  # fmt: skip
        assert line in text, line
    assert "user " not in text
    assert text.count("{") == text.count("}")
    assert _peers.nginx_config(tmp_path, 8123, "http://127.0.0.1:9001/v1", as_root=True).startswith("user root;\n")


def test_litellm_config_points_one_openai_model_at_the_fake_upstream() -> None:
    config = yaml.safe_load(_peers.litellm_config("http://127.0.0.1:9001/v1"))
    assert config["model_list"] == [{"model_name": "auto", "litellm_params": {
        "model": "openai/auto", "api_base": "http://127.0.0.1:9001/v1", "api_key": "bench"}}]  # fmt: skip
    assert "database_url" not in json.dumps(config).lower()
    assert _peers.LITELLM_ENV["LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY"] == "true"


def test_peers_start_with_the_generated_configs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "litellm").write_text("")
    nginx = tmp_path / "nginx"
    nginx.write_text("")
    peers = _peers.Peers(tmp_path / "work", venv=venv, nginx=str(nginx))  # what is run is checked, not run
    argv, env = peers.nginx(8123, "http://127.0.0.1:9001/v1", as_root=False)
    assert argv[0] == str(nginx) and argv[argv.index("-c") + 1].endswith("nginx-8123/nginx.conf")
    assert "listen 127.0.0.1:8123;" in Path(argv[argv.index("-c") + 1]).read_text() and env == {}
    argv, env = peers.litellm(8124, "http://127.0.0.1:9001/v1")
    assert argv[:2] == [str(venv / "bin" / "litellm"), "--config"] and argv[-2:] == ["--num_workers", "1"]
    assert yaml.safe_load(Path(argv[2]).read_text())["model_list"][0]["litellm_params"]["model"] == "openai/auto"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def test_peers_missing_names_the_install_script(tmp_path: Path) -> None:
    with pytest.raises(_peers.PeerMissing, match=r"LiteLLM proxy \(in .*\) not installed.*install-peers\.sh"):
        _peers.Peers(tmp_path / "work", venv=tmp_path / "no-venv")
    assert not (tmp_path / "work").exists()
    completed = bench(tmp_path / "results", "--peers", env={"D3_PEERS_VENV": str(tmp_path / "no-venv")})
    assert completed.returncode == 2
    assert "bash benchmarks/install-peers.sh" in completed.stderr and "Traceback" not in completed.stderr
    assert not (tmp_path / "results").exists()  # stopped before measuring anything


def test_peer_summary_sets_d3router_against_each_peer() -> None:
    def row(target: str, concurrency: int, rps: float, errors: int = 0) -> dict[str, Any]:
        return {"target": target, "concurrency": concurrency, "rps": rps, "errors": errors}

    rows = [row("d3router cache hit", 1, 1000), row("d3router cache hit", 8, 2000), row("nginx", 1, 2000),
            row("nginx", 8, 8000), row("litellm proxy", 1, 100, errors=5), row("stream, d3router cache hit", 1, 900),
            row("stream, nginx", 1, 1800)]  # fmt: skip
    lines = _peers.vs_d3router(rows)
    assert rows[2][_peers.COLUMN] == 2.0 and rows[4][_peers.COLUMN] == 0.1
    assert lines["nginx"] == ("d3router cache hit requests/s over nginx's at c=1/8: x 0.50, 0.25; target >= 0.4 at "
                              "each (MISSED)")  # fmt: skip
    assert lines["litellm proxy"].endswith("x 10.00; litellm proxy had 5 errors (see its rows)")
    assert lines["stream, nginx"].startswith(
        "stream, d3router cache hit requests/s over stream, nginx's at c=1: x 0.50"
    )
