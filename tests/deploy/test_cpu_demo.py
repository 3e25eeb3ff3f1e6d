"""The cpu-demo overlay's pods, run as plain processes: the engine container's exact command line and environment
serve the tiny model with a real vLLM, and the rendered router.yaml, with the Secret's keys in the environment,
decides and routes a chat request through it. (No cluster and no Docker engine here: this is the part of the
demo that can run.)"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from d3backend import free_port
from tests.conftest import require_vllm
from tests.deploy.test_manifests import KUSTOMIZE, one, render

pytestmark = pytest.mark.engine


def wait_ok(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    pytest.fail(f"{url} never answered 200:\n{process.communicate()[0].decode()[-3000:]}", pytrace=False)


def stop(process: subprocess.Popen[bytes]) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.communicate(timeout=60)[0].decode()
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()[0].decode()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[str]:
    require_vllm()
    objects = render(KUSTOMIZE / "overlays" / "cpu-demo")
    (container,) = one(objects, "Deployment", "d3-engine")["spec"]["template"]["spec"]["containers"]
    port = free_port()
    swap = {"--model=/models/tiny": f"--model={tiny_model}", "--host=0.0.0.0": "--host=127.0.0.1",
            "--port=8000": f"--port={port}"}  # fmt: skip
    argv = [sys.executable, *container["command"][1:], *(swap.get(arg, arg) for arg in container["args"])]
    tmp = tmp_path_factory.mktemp("engine-tmp")
    # The image's ENV (Dockerfile, engine target) with /tmp made this test's own folder, then the container's env.
    env = {**os.environ, "HOME": str(tmp), "TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "HF_HOME": str(tmp / "hf"), "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update({item["name"]: item["value"] for item in container["env"]})
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ok(f"{url}/health", process, 180)
    yield url
    stop(process)


def test_the_demo_routes_a_chat_through_the_manifests_engine(engine: str, tmp_path: Path) -> None:
    objects = render(KUSTOMIZE / "overlays" / "cpu-demo")
    config = one(objects, "ConfigMap", "d3router-config")["data"]["router.yaml"]
    path = tmp_path / "router.yaml"
    # The manifest's configuration stays closed (issue 25.4); the test turns on the debug headers to see that the
    # engine decided (x-d3-rule, x-d3-degraded).
    assert "expose_decisions" not in config and "\nserver:\n" in config
    config = config.replace("\nserver:\n", "\nserver:\n  expose_decisions: true\n", 1)
    path.write_text(config.replace("http://d3-engine:8000", engine), encoding="utf-8")
    secret = one(objects, "Secret", "d3router-upstream-keys")["data"]
    env = {**os.environ, **{key: base64.b64decode(value).decode() for key, value in secret.items()}}
    port = free_port()
    router = subprocess.Popen([sys.executable, "-m", "router", "serve", str(path), "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ok(f"{url}/readyz", router, 60)  # ready: the engine answered the router's probe
        body = {"model": "auto", "messages": [{"role": "user", "content": "Write a sorting function in C."}]}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.headers["x-d3-rule"] in {"hard-work", "default"}
        assert "x-d3-degraded" not in response.headers  # decided by the engine, not by on_engine_error
        assert response.json()["choices"][0]["message"]["role"] == "assistant"
    finally:
        output = stop(router)
    assert router.returncode == 0, output
    assert "replace-me" not in output  # the key is never logged
