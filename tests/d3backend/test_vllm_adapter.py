"""Without vLLM installed, the embedded engine says which extra to install."""

from __future__ import annotations

import sys

import pytest

from d3backend import EmbeddedEngine, _vllm

pytestmark = pytest.mark.anyio


async def test_missing_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    monkeypatch.setattr(_vllm, "is_cpu_build", lambda: False)
    engine = EmbeddedEngine("vllm-sr/d3-mini")
    with pytest.raises(ImportError, match=r"pip install 'd3-router\[vllm\]' on a GPU machine, or 'd3-router\[cpu\]'"):
        await engine.start()
    with pytest.raises(RuntimeError, match="not started"):
        await engine.decide("x", {})


def test_argv_adds_the_cpu_flags_on_the_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_vllm, "is_cpu_build", lambda: True)
    engine = EmbeddedEngine(
        "/models/tiny",
        served_model_name="tiny",
        max_model_len=2048,
        kv_cache_memory_bytes="256M",
        extra_args=["--seed", "1"],
    )
    assert engine.argv == [
        "--model", "/models/tiny", "--served-model-name", "tiny", "--dtype", "auto", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", "256M", "--enforce-eager", "--distributed-executor-backend", "uni",
        "--logprobs-mode", "raw_logprobs", "--seed", "1",
    ]  # fmt: skip
    monkeypatch.setattr(_vllm, "is_cpu_build", lambda: False)
    assert EmbeddedEngine().argv == [
        "--model",
        "vllm-sr/d3-mini",
        "--served-model-name",
        "vllm-sr/d3-mini",
        "--dtype",
        "auto",
    ]


def test_first_importable_module_wins() -> None:
    assert _vllm._import_first(["no.such.module", "json"]).__name__ == "json"
    with pytest.raises(ImportError, match=r"^none of no\.such, also\.none could be imported"):
        _vllm._import_first(["no.such", "also.none"])
