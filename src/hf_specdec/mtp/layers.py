"""A model's multi-token-prediction (MTP) layers, as the MTP drafter runs them.

Models such as DeepSeek-V3, GLM-4.5 (`glm4_moe`), ERNIE 4.5 MoE, Mellum, Bailing hybrid or Inkling ship
`config.num_mtp_layers` extra layers that transformers loads apart from the model (`MtpModel`, which shares the
model's embeddings, lm_head and rotary embedding). MTP layer k at slot t reads the token `k + 1` places after
t and a feature of slot t (the target's last hidden state for k = 0, layer k-1's output otherwise):

    g_t^k = post_norm(Block_k(eh_proj([enorm(embed(x_{t+k+1})), hnorm(g_t^{k-1})])))

at the position of that token, under causal attention over its own cache, and `lm_head(g_t^k)` predicts
`x_{t+k+2}`. `MtpLayerStep` presents one such layer as a model a `CachedSequence` can run: its input vectors
carry the token's embedding and the feature side by side.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_layers import MtpModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.generation.readback import HostReads

# The MTP layers loaded for (or attached to) a model, kept beside it rather than as one of its submodules.
_LOADED: weakref.WeakKeyDictionary[PreTrainedModel, MtpModel] = weakref.WeakKeyDictionary()


def num_mtp_layers(model: PreTrainedModel) -> int:
    """How many MTP layers the model's config declares (0 when none)."""
    return int(getattr(model.config.get_text_config(decoder=True), "num_mtp_layers", None) or 0)


def attach_mtp(model: PreTrainedModel, mtp: MtpModel) -> None:
    """Use `mtp` as `model`'s MTP layers (already in memory: built from the model, or loaded by the caller)."""
    if len(mtp.layers) == 0:
        raise ValueError("The MTP model has no layers.")
    _LOADED[model] = mtp


def mtp_layers(model: PreTrainedModel) -> MtpModel:
    """`model`'s MTP layers: the ones attached to it, else loaded once from its checkpoint (transformers'
    `MtpModel.from_pretrained`, on the device of the model's last layer). Refuses models without any."""
    mtp = _LOADED.get(model)
    if mtp is not None:
        return mtp
    if num_mtp_layers(model) < 1:
        raise ValueError(
            f"{type(model).__name__} has no multi-token-prediction layers (its config sets no `num_mtp_layers`), "
            "so it cannot draft for itself with `use_mtp=True`. Pass `assistant=` (a draft model) or "
            "`prompt_lookup_num_tokens=` instead."
        )
    device = next(model.get_decoder().layers[-1].parameters()).device
    mtp = MtpModel.from_pretrained(model, device_map={"": device}).eval()
    _LOADED[model] = mtp
    return mtp


class SingleLayerCache(DynamicCache):
    """A `DynamicCache` holding one layer, whatever index the layer was built with (MTP layer k's attention
    writes to index k; each MTP layer keeps its own cache here)."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().update(key_states, value_states, 0, *args, **kwargs)


class MtpLayerStep(nn.Module):
    """MTP layer `index` of `mtp` (its own modules, not copies) as a model: `inputs_embeds` `(B, q, 2H)` holds
    each slot's token embedding, then its feature; the output's `last_hidden_state` `(B, q, H)` is the layer's
    feature at each slot. Masks and positions are the caller's (a `CachedSequence`'s)."""

    _supports_attention_backend = True  # masks by the masks it is given (`positions.slot_indexed_mask_size`)

    def __init__(self, mtp: MtpModel, index: int) -> None:
        super().__init__()
        self.layer = mtp.layers[index]
        self.config = mtp.config
        self.rotary_emb = mtp.rotary_emb
        self.shared_post_norm = mtp.shared_post_norm if mtp.use_shared_post_norm else None
        layer_types = getattr(mtp.config, "layer_types", None)
        self.layer_type: str | None = layer_types[index] if layer_types is not None else None
        self.rope_kwargs = {"layer_type": self.layer_type} if mtp.has_per_layer_rope else {}
        if self.rope_kwargs:
            check_rope_layer_type(mtp, index, self.layer_type)
        self.hidden_size = int(mtp.config.hidden_size)

    @property
    def dtype(self) -> torch.dtype:
        return self.layer.eh_proj.weight.dtype

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | dict[str, torch.Tensor],
        position_ids: torch.Tensor,
        cache: DynamicCache,
        use_cache: bool = True,
        output_hidden_states: bool = False,
    ) -> BaseModelOutputWithPast:
        embeds, features = inputs_embeds.split(self.hidden_size, dim=-1)
        if isinstance(attention_mask, dict):  # full and sliding layers mixed: this layer's kind
            attention_mask = attention_mask[self.layer_type or "full_attention"]
        position_embeddings = None
        if self.rotary_emb is not None:
            position_embeddings = self.rotary_emb(embeds, position_ids=position_ids, **self.rope_kwargs)
        hidden = self.layer(
            embeds,
            features,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
        )
        if self.shared_post_norm is not None:
            hidden = self.shared_post_norm(hidden)
        return BaseModelOutputWithPast(last_hidden_state=hidden)


def check_rope_layer_type(mtp: MtpModel, index: int, layer_type: str | None) -> None:
    """Refuse an MTP layer of an attention kind the model's shared rotary embedding holds no frequencies for
    (it builds them for the kinds of the model's own layers: a model whose layers are all full attention with
    a sliding-window MTP layer), which transformers' MTP layers cannot run either."""
    known = getattr(mtp.rotary_emb, "rope_type", None)
    if isinstance(known, dict) and layer_type not in known:
        raise ValueError(
            f"MTP layer {index} is a {layer_type!r} layer, but the model's rotary embedding holds frequencies for "
            f"its own layers' kinds only ({sorted(known)}), so the MTP layer has no positions to attend with "
            "(transformers' MTP layers fail the same way). Decode this model without `use_mtp=True`, or give its "
            "MTP layers the kind of its own layers (`mtp_layer_types`)."
        )


def mtp_logits(mtp: MtpModel, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The target's float32 logits `(..., vocab_size)` for MTP features `(..., H)`, through the shared lm_head
    as the target applies it (a muP width multiplier; cut or padded with -inf to the target's vocabulary)."""
    multiplier = getattr(mtp.config, "logits_mup_width_multiplier", None)
    if multiplier is not None:
        hidden = hidden / multiplier
    weight = mtp.shared_head.weight
    logits = mtp.shared_head(hidden.to(weight.device, weight.dtype)).float()
    size = logits.shape[-1]
    if size > vocab_size:
        return logits[..., :vocab_size]
    if size < vocab_size:
        return torch.nn.functional.pad(logits, (0, vocab_size - size), value=float("-inf"))
    return logits


def layer_sequence(
    step: MtpLayerStep, batch_size: int, device: torch.device, reads: HostReads | None
) -> CachedSequence:
    """A `CachedSequence` (holes, positions, compaction) over one MTP layer with its own cache."""
    seq = CachedSequence(step, batch_size, device, reads)  # type: ignore[arg-type]
    seq.cache = SingleLayerCache()
    return seq
