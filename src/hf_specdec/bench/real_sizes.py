"""Random-weight models in the exact shapes of published checkpoints, built on a device without a download.

A GPU machine may have no network; what a forward costs depends on the shapes, not on the weights, so
`hf-specdec gpu` times these. The `tiny` scale keeps the names and the architectures with two small layers, so that
the same command runs end to end on a CPU in seconds.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

# The `config.json` fields that set the shapes (Qwen/Qwen2.5-*-Instruct, meta-llama/Llama-3.*-Instruct).
REAL_SIZES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "qwen2.5-1.5b": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6),
    ),
    "qwen2.5-0.5b": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6),
    ),
    "llama-3.1-8b": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=5e5),
    ),
    "llama-3.2-1b": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=5e5),
    ),
}  # fmt: skip

# Target and draft of each measured pair (they share a tokenizer).
PAIRS: tuple[tuple[str, str], ...] = (("qwen2.5-1.5b", "qwen2.5-0.5b"), ("llama-3.1-8b", "llama-3.2-1b"))

_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def build_random(name: str, device: str | torch.device, dtype: torch.dtype, tiny: bool = False) -> PreTrainedModel:
    """A randomly initialised model of `name`'s shapes (a key of `REAL_SIZES`) on `device`, in eval mode.

    With `tiny`, two small layers over the same vocabulary (a CPU check of everything around the forwards)."""
    if name not in REAL_SIZES:
        raise ValueError(f"Unknown model size {name!r}; choose from {sorted(REAL_SIZES)}.")
    config_class, model_class, sizes = REAL_SIZES[name]
    if tiny:
        sizes = {**sizes, **_TINY, "vocab_size": 512}
    config = config_class(**sizes, max_position_embeddings=8192)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class._from_config(config, dtype=dtype)
    return model.eval()
