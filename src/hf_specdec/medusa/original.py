"""Read head checkpoints of the original Medusa release (`medusa_lm_head.pt` + `config.json`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from hf_specdec.medusa.config import MedusaConfig

ORIGINAL_WEIGHTS_NAME = "medusa_lm_head.pt"


def load_original(directory: Path) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
    """Convert an original Medusa checkpoint to this library's config and heads' state dict.

    The original stores `medusa_head` as a `ModuleList` of `Sequential(ResBlock * num_layers, Linear)`, so its
    keys read `{head}.{layer}.linear.weight` / `.bias` for the blocks and `{head}.{num_layers}.weight` for the
    projection; its `config.json` holds `medusa_num_heads`, `medusa_num_layers` and `base_model_name_or_path`.
    """
    meta = json.loads((directory / "config.json").read_text())
    if "medusa_num_heads" not in meta:
        raise ValueError(f"{directory / 'config.json'} has no `medusa_num_heads`: not an original Medusa checkpoint.")
    num_heads, num_layers = int(meta["medusa_num_heads"]), int(meta.get("medusa_num_layers", 1))
    raw = torch.load(directory / ORIGINAL_WEIGHTS_NAME, map_location="cpu", weights_only=True)
    state: dict[str, torch.Tensor] = {}
    pattern = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)$")
    for key, tensor in raw.items():
        match = pattern.match(key)
        if match is None:
            raise ValueError(f"Unexpected key {key!r} in {ORIGINAL_WEIGHTS_NAME}.")
        head, layer, kind = int(match[1]), int(match[2]), match[3]
        if layer < num_layers:
            state[f"blocks.{head}.{layer}.linear.{kind}"] = tensor
        else:
            state[f"projections.{head}.{kind}"] = tensor
    hidden = state["blocks.0.0.linear.weight"].shape[0] if num_layers else None
    vocab = state["projections.0.weight"].shape[0]
    config = MedusaConfig(
        num_heads=num_heads,
        num_layers=num_layers,
        share_lm_head=False,
        hidden_size=hidden,
        vocab_size=vocab,
        base_model_name_or_path=meta.get("base_model_name_or_path"),
    )
    return config, state
