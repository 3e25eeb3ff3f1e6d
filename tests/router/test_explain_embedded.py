"""`d3router explain` with the embedded engine writes only its JSON to stdout: vLLM, embedded, logs to stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]


def test_stdout_holds_only_the_json(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(f"""
engine:
  embedded: {{model: "{tiny_model}", served_model_name: d3-tiny, max_model_len: 2048, dtype: float32,
             kv_cache_memory_bytes: 256M}}
  max_choice_options: 26
upstreams: {{up: {{url: "http://127.0.0.1:9/v1"}}}}
policies:
  auto:
    questions: {{jailbreak: {{type: noul}}}}
    rules: [{{name: guard, when: jailbreak > 2, block: {{}}}}, {{name: default, route: up}}]
""", encoding="utf-8")  # fmt: skip
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "auto", "input": "hi"}), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "router", "explain", str(config), str(body)], cwd=REPO,
                            capture_output=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    explained = json.loads(result.stdout)  # nothing but the JSON: vLLM's log lines went to stderr
    assert (explained["api"], explained["decision"]["rule"]) == ("responses", "default")
    assert "jailbreak" in explained["answers"]
    assert b"vllm" in result.stderr.lower()
