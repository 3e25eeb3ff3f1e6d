"""A tiny generative model the project builds itself, so tests and the offline demo never download anything.

    >>> from d3backend import make_model
    >>> make_model("/tmp/d3-tiny")                          # doctest: +SKIP

It is a `Qwen3ForCausalLM` with random weights (hidden 64, 2 layers, head_dim 32, ~360k parameters) and a
byte-level BPE tokenizer trained here on a fixed corpus. vLLM's CPU build serves `/v1/systemone` for it by
reading the label tokens' probabilities. **Its answers are arbitrary**: real, deterministic numbers from the
same engine code and wire format, but they mean nothing. Production uses `vllm-sr/d3-mini`.

The build is deterministic: the same seed gives byte-identical files.
"""

from __future__ import annotations

import json
import os
import random
import string
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# vLLM requires each label to be one distinct token at the start of a reply (CPU_ENGINE.md).
LABELS = [*string.ascii_uppercase, "yes", "no", *string.digits]

# A Qwen3-style template: ChatML turns, and `enable_thinking: false` closes an empty thought, as Qwen3's does.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Qwen2's pre-tokenizer split pattern.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_WORDS = """
the a an and or not is are was be to of in on for with as by at from this that it its you your we our they
what which who how why when where can could should would will do does did make write fix explain code function
class method bug error test python rust go java javascript sql query database table index server client request
response api json yaml model router policy question answer state option level score choice yes no true false
math number sum product prove equation integral derivative matrix vector probability hard easy trivial expert
moderate difficult simple quick help please thanks hello hi weather story poem joke recipe travel plan email
letter summary translate french german spanish data user assistant system message content image video ignore
rules previous instructions pretend jailbreak secret password personal name address phone card account private
kind work reasoning step steps multi one two three four five ten hundred thousand first last next before after
""".split()


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":"]))
    for label in LABELS:  # every label, alone on a line, many times: each becomes one token
        lines.extend([label] * 50)
    for _ in range(500):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(f"What is {a} + {b}? {a + b}")
        lines.append(f"def f{a}(x):\n    return x * {b}\n")
        lines.append(f"Question: Is this {rng.choice(_WORDS)}?\nA: {rng.choice(_WORDS)}\nAnswer with yes or no only.")
    return lines


def _tokenizer(seed: int, vocab_size: int) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    tail = tokenizer.encode("\n\n").ids
    for label in LABELS:
        ids = tokenizer.encode("\n\n" + label).ids
        if ids[:-1] != tail or len(ids) != len(tail) + 1:
            raise RuntimeError(f"label {label!r} is not one token after the chat prompt; change the corpus")
    return tokenizer


def _weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    std = config["initializer_range"]
    hidden, inter, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    def normal(*shape: int) -> Any:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    def ones(size: int) -> Any:
        return np.ones(size, dtype=np.float32)

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden), "model.norm.weight": ones(hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        tensors |= {
            f"{prefix}.input_layernorm.weight": ones(hidden),
            f"{prefix}.post_attention_layernorm.weight": ones(hidden),
            f"{prefix}.self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            f"{prefix}.self_attn.q_norm.weight": ones(head_dim),
            f"{prefix}.self_attn.k_norm.weight": ones(head_dim),
            f"{prefix}.mlp.gate_proj.weight": normal(inter, hidden),
            f"{prefix}.mlp.up_proj.weight": normal(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": normal(hidden, inter),
        }
    return tensors


def make_model(directory: str | os.PathLike[str], *, seed: int = 0, vocab_size: int = 4096) -> Path:
    """Build the tiny model into `directory` (created if needed) and return its path.

    Needs `tokenizers`, `numpy` and `safetensors`, which vLLM brings (`pip install 'd3-router[cpu]'`).
    """
    try:
        from safetensors.numpy import save_file
    except ImportError as exc:  # pragma: no cover - only without the extra
        raise ImportError("building the tiny model needs vLLM's dependencies: pip install 'd3-router[cpu]'") from exc

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(seed, vocab_size)
    vocab = tokenizer.get_vocab_size()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,  # vLLM's CPU attention supports 32, 64, 80, ... (CPU_ENGINE.md)
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "initializer_range": 0.5,  # large, so that answers vary with the input
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
    }
    tokenizer.save(str(path / "tokenizer.json"))
    added = {
        str(ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    for name, payload in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation),
    ):
        (path / name).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file(_weights(config, seed), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
