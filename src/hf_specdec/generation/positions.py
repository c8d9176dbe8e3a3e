"""How far a model's positions reach, and where verifying several positions in one forward stops matching
plain decoding.

Two kinds of position encodings limit speculative decoding:

- **Position tables** (learned absolute positions: GPT-2's `wpe`, OPT's `embed_positions`; precomputed rotary
  angles: GPT-J's and CodeGen's `embed_positions`): one row per position, so a position past the table's end is an
  index error. A target cannot generate past it (plain `generate()`
  fails there too); a draft stops drafting at it (`learned_position_limit`).
- **Rotary frequencies that depend on the length of the forward** (`rope_type="dynamic"`, `"longrope"`):
  transformers recomputes them from the largest position in each forward, once it passes the original
  context length. Verifying positions `p..p+k` in one forward would then rotate position `p` as if the text
  were `p+k` long, where plain decoding rotates it at length `p`: the outputs differ. Below that length the
  frequencies are the original ones in every forward, so speculative decoding matches plain decoding exactly
  there (`length_dependent_rope_limit`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel


def position_limit(model: PreTrainedModel) -> int | None:
    """The largest number of positions the model's config declares (`max_position_embeddings`, GPT-2's
    `n_positions`, `n_ctx`), or `None` when it declares none."""
    config = model.config.get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def position_table_limit(model: PreTrainedModel) -> int | None:
    """How many positions a model that looks positions up in a table can take, or `None` when it takes any
    position (rotary frequencies computed on the fly).

    A table is an embedding other than the token embedding (GPT-2's `wpe`, OPT's `embed_positions`), or a buffer
    of precomputed rotary angles (GPT-J's and CodeGen's `embed_positions`), with one row per position: at least
    as many rows as the declared limit, and at most two more (OPT's offset). The declared limit is returned.
    """
    limit = position_limit(model)
    if limit is None:
        return None
    tokens = model.get_input_embeddings()
    for module in model.modules():
        if isinstance(module, nn.Embedding) and module is not tokens and limit <= module.num_embeddings <= limit + 2:
            return limit
    for _, buffer in model.named_buffers():
        if buffer.dim() == 2 and limit <= buffer.shape[0] <= limit + 2:
            return limit
    return None


def slot_indexed_mask_size(model: PreTrainedModel) -> int | None:
    """The size of a square causal-mask table the model slices by the length of its cache (GPT-Neo's `bias`), or
    `None`. Such a model masks by cache slot, not by the masks and positions it is given. Models that attend through
    transformers' attention interface mask with the masks they are given, whatever tables they keep (GPT-BigCode
    allocates one it never reads)."""
    if getattr(model, "_supports_attention_backend", False):
        return None
    for _, buffer in model.named_buffers():
        if buffer.dim() >= 2 and buffer.shape[-1] == buffer.shape[-2] > 1 and buffer.dtype == torch.bool:
            return int(buffer.shape[-1])
    return None


def _rope_settings(config: Any) -> list[dict[str, Any]]:
    """Every rotary setting of a config: `rope_parameters` (or the older `rope_scaling`), which is one dict or,
    for models whose layer types rotate differently, a dict of them by layer type."""
    settings = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(settings, dict):
        return []
    if all(isinstance(value, dict) for value in settings.values()) and settings:
        return list(settings.values())
    return [settings]


def length_dependent_rope_limit(model: PreTrainedModel) -> int | None:
    """The longest text (prompt plus generated tokens) over which the model's rotary frequencies stay those of
    its original context in every forward, for rope types that recompute them from the forward's length
    (`"dynamic"`, `"longrope"`); `None` when its frequencies do not depend on the length."""
    config = model.config.get_text_config(decoder=True)
    limits = []
    for setting in _rope_settings(config):
        rope_type = str(setting.get("rope_type", setting.get("type", "default")))
        if "dynamic" in rope_type:
            # transformers regrows the frequencies once a forward passes `max_position_embeddings`.
            limits.append(position_limit(model))
        elif rope_type == "longrope":
            original = setting.get("original_max_position_embeddings")
            limits.append(original if isinstance(original, int) else position_limit(model))
    known = [limit for limit in limits if limit is not None]
    if len(known) < len(limits):
        return 0  # a length-dependent rope with no length declared: no forward is known to be safe
    return min(known) if known else None


def check_position_limits(model: PreTrainedModel, max_length: int, role: str = "target") -> None:
    """Raise `ValueError` when generating up to `max_length` tokens (prompt included) could take `model` where
    speculative decoding cannot follow plain decoding: past a learned position table's end, or past the
    length at which length-dependent rotary frequencies start to change with each forward."""
    learned = position_table_limit(model)
    if learned is not None and max_length > learned:
        raise ValueError(
            f"max_length={max_length} (prompt plus new tokens) is more than the {learned} positions the {role} "
            f"({type(model).__name__}) has a position table for. Keep prompt plus max_new_tokens within "
            f"{learned}."
        )
    rope = length_dependent_rope_limit(model)
    if rope is not None and max_length > rope:
        raise ValueError(
            f"The {role} ({type(model).__name__}) recomputes its rotary frequencies from the length of each forward "
            f"(a 'dynamic' or 'longrope' rope type) once a text passes {rope} tokens; verifying several drafted "
            "tokens in one forward would then rotate them differently from plain decoding, so the output could "
            f"differ. Keep prompt plus max_new_tokens within {rope} (max_length={max_length} was asked), or "
            "decode this model with plain `generate()`."
        )
