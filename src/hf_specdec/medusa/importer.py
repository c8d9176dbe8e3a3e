"""Read Medusa heads published in other layouts than this library's: every FasterDecoding variant and every
engine layout `hf_specdec.serving.export` writes.

- FasterDecoding's Medusa-1 release: `config.json` (`medusa_num_heads`, `medusa_num_layers`,
  `base_model_name_or_path`) with `medusa_lm_head.pt`; its later trainers, TGI and TensorRT-LLM use the same
  names in `medusa_lm_head.safetensors`. The heads are counted in the weights: the published
  `medusa-vicuna-7b-v1.3` says 2 heads in its config and holds 4. A folder with the weights alone loads too.
- Medusa-2 heads that project with the base's lm_head (only residual blocks in the file, TGI's "Medusa v2").
- A whole Medusa-2 model (the base's weights and `medusa_head.*` in `model*.safetensors`): the heads come from
  it, and the folder itself is their base, since Medusa-2 trains the base too.
- vLLM's layout (`config.json` with `model_type: medusa`).
- Published EAGLE drafts (EAGLE-1, 2 and 3, and the speculators format): `hf_specdec.medusa.eagle_importer`.

Pickled `.pt` files are read with `torch.load(weights_only=True)`: tensors only, no code runs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hf_specdec.medusa.config import MedusaConfig
from hf_specdec.medusa.eagle_importer import ImportedEagle, read_eagle
from hf_specdec.medusa.layouts import from_numbered, from_vllm

logger = logging.getLogger(__name__)

NUMBERED_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
_WHOLE_MODEL_PREFIXES = ("medusa_head.", "medusa_heads.")
# Every layout `read_heads` and `MedusaForCausalLM.from_pretrained` read, for the message of a folder of none.
SUPPORTED_LAYOUTS = (
    "this library's (medusa_config.json and medusa_heads.safetensors)",
    "FasterDecoding's, TGI's or TensorRT-LLM's Medusa heads (medusa_lm_head.pt or medusa_lm_head.safetensors)",
    "a whole Medusa-2 model (config.json with medusa_num_heads, medusa_head.* in model*.safetensors)",
    "vLLM's Medusa layout (config.json with model_type: medusa)",
    "EAGLE-3 as SafeAILab, SpecForge or AngelSlim release it (config.json with architectures "
    "LlamaForCausalLMEagle3; midlayer.*, fc, norm, lm_head, d2t, t2d)",
    "EAGLE-3 in the speculators format (config.json with speculators_model_type: eagle3; layers.0.*)",
    "EAGLE-1 and 2 as SafeAILab releases them or vLLM loads them (config.json a LlamaConfig; fc.weight (H, 2H), "
    "layers.*)",
)


def no_heads_message(directory: Path, lead: str) -> str:
    """`lead` (what holds no heads), then every layout read and the files found in `directory`."""
    found = sorted(path.name for path in directory.iterdir()) if directory.is_dir() else []
    shown = ", ".join(found[:20]) + (f" and {len(found) - 20} more" if len(found) > 20 else "")
    layouts = "; ".join(f"({i}) {layout}" for i, layout in enumerate(SUPPORTED_LAYOUTS, 1))
    return (
        f"{lead}, in none of the layouts this library reads: {layouts}. Found there: {shown or 'no files'}. Pass a "
        "folder written by `save_pretrained` or a recipe run, or a published draft"
    )


@dataclass
class ImportedHeads:
    """Heads read from another layout, before they meet their base.

    Attributes:
        config (`MedusaConfig`): sizes from the weights; `vocab_size` is `None` when no projection tells it.
        state (`dict[str, torch.Tensor]`): the heads' weights in this library's names.
        lm_head (`torch.Tensor`, *optional*): one projection every head uses, stored in the file (vLLM's
            `original_lm_head`); [`bind`] decides whether it is the base's own.
        layout (`str`): what was read, for messages.
    """

    config: MedusaConfig
    state: dict[str, torch.Tensor]
    lm_head: torch.Tensor | None
    layout: str

    def bind(
        self, base_lm_head: torch.Tensor, base_embeddings: torch.Tensor | None = None
    ) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
        """The config and weights for heads on a base whose lm_head weight is `base_lm_head`: a projection equal
        to the base's (an exported copy) becomes `share_lm_head=True`, one that differs stays the heads' own.
        (`base_embeddings` is for EAGLE drafts, `ImportedEagle.bind`.)"""
        config, state = self.config, dict(self.state)
        token_ids = state.get("token_ids")
        own = [state[key] for key in sorted(state) if key.startswith("projections.")]
        stored = own or ([] if self.lm_head is None else [self.lm_head])
        if not stored:
            return config, state
        reference = base_lm_head.detach().to("cpu")
        if token_ids is not None and self.lm_head is None:
            reference = reference[token_ids]  # own projections hold the draft vocabulary's rows only
        if all(p.shape == reference.shape and torch.equal(p, reference.to(p.dtype)) for p in stored):
            config.share_lm_head = True
            return config, {k: v for k, v in state.items() if not k.startswith("projections.")}
        if self.lm_head is not None:  # a projection of the heads' own, shared by every head: one copy per head
            rows = self.lm_head if token_ids is None else self.lm_head[token_ids]
            state.update({f"projections.{k}.weight": rows for k in range(config.num_heads)})
        config.share_lm_head = False
        return config, state


def read_heads(directory: Path) -> ImportedHeads | ImportedEagle | None:
    """The heads in `directory` in any layout of the module's docstring, or `None` when there are none.

    Raises:
        `ValueError`: when the files are there but inconsistent (keys of no known role, incomplete heads).
    """
    meta = _read_json(directory / "config.json")
    numbered = next((directory / name for name in NUMBERED_WEIGHTS if (directory / name).exists()), None)
    if numbered is not None:  # FasterDecoding's names, whatever the config (vLLM reads them too)
        raw = _load_weights(numbered)
        return _from_numbered(raw, meta, str(numbered), meta.get("base_model_name_or_path"), "numbered")
    if meta.get("model_type") == "medusa":
        return _read_vllm(directory, meta)
    if "medusa_num_heads" in meta:
        raw = _whole_model_heads(directory)
        if raw:
            return _from_numbered(raw, meta, str(directory), str(directory), "whole Medusa-2 model")
    return read_eagle(directory, meta)


def _from_numbered(
    raw: dict[str, torch.Tensor], meta: dict[str, Any], source: str, base: str | None, layout: str
) -> ImportedHeads:
    state, num_heads, num_layers = from_numbered(raw, source)
    _warn_if_config_disagrees(meta, source, num_heads, num_layers, ("medusa_num_heads", "medusa_num_layers"))
    return ImportedHeads(_config(state, num_heads, num_layers, base), state, None, layout)


def _read_vllm(directory: Path, meta: dict[str, Any]) -> ImportedHeads:
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin")) + sorted(directory.glob("*.pt"))
    if not files:
        raise ValueError(f"{directory}: a vLLM Medusa config but no weights (*.safetensors, *.bin or *.pt) beside it.")
    raw: dict[str, torch.Tensor] = {}
    for file in files:
        raw.update(_load_weights(file))
    state, num_heads, num_layers, shared = from_vllm(raw, str(directory))
    _warn_if_config_disagrees(meta, str(directory), num_heads, num_layers, ("num_heads", "num_hidden_layers"))
    if not meta.get("medusa_fc_bias", False) and any(
        key.endswith(".bias") and key.startswith("blocks.") for key in raw
    ):
        logger.warning(
            "%s: the blocks have biases but the config lacks `medusa_fc_bias: true`, so vLLM serves them without; "
            "loading them with their biases.",
            directory,
        )
    if "token_ids" in state and shared is None:
        raise ValueError(f"{directory}: a `token_map` with per-head lm_heads: vLLM itself cannot load that.")
    config = _config(state, num_heads, num_layers, meta.get("base_model_name_or_path"))
    config.vocab_size = config.vocab_size or meta.get("vocab_size") or (None if shared is None else shared.shape[0])
    return ImportedHeads(config, state, shared, "vLLM")


def _config(state: dict[str, torch.Tensor], num_heads: int, num_layers: int, base: str | None) -> MedusaConfig:
    block = state.get("blocks.0.0.linear.weight")
    projection = state.get("projections.0.weight")
    token_ids = state.get("token_ids")
    return MedusaConfig(
        num_heads=num_heads,
        num_layers=num_layers,
        share_lm_head=projection is None,
        hidden_size=None if block is None else block.shape[0],
        vocab_size=None if projection is None or token_ids is not None else projection.shape[0],
        head_vocab_size=None if token_ids is None else token_ids.numel(),
        base_model_name_or_path=base,
    )


def _warn_if_config_disagrees(
    meta: dict[str, Any], source: str, num_heads: int, num_layers: int, keys: tuple[str, str]
) -> None:
    for key, found in zip(keys, (num_heads, num_layers), strict=True):
        if key in meta and int(meta[key]) != found:
            logger.warning(
                "%s: config.json says %s=%s but the weights hold %d; using %d.", source, key, meta[key], found, found
            )


def _whole_model_heads(directory: Path) -> dict[str, torch.Tensor]:
    """The `medusa_head.*` tensors of a whole model's safetensors shards (the base's weights are not read)."""
    raw = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if key.startswith(_WHOLE_MODEL_PREFIXES):
                    raw[key] = handle.get_tensor(key)
    return raw


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(path)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"{path} is not a state dict (a mapping of names to tensors).")
    return loaded


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
