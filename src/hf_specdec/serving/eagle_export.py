"""Write EAGLE heads as published drafts (layouts in `hf_specdec.medusa.eagle_layouts`) for vLLM:

- EAGLE-3 heads: the layout SafeAILab, SpecForge and AngelSlim release (`layout="published"`, for
  `speculative_config={"method": "eagle3", "model": DIR}`; `Eagle3Qwen3ForCausalLM` for heads of a Qwen3 layer),
  or the speculators format (`layout="speculators"`, which vLLM also reads, its config carrying the method and the
  number of drafted tokens, the layer's `model_type` choosing vLLM's class). The variants (`norm_before_residual`,
  `norm_before_fc`, `fc_norm`, `norm_output`) are written as vLLM reads them. The fused layers are
  written as `eagle_aux_hidden_state_layer_ids`, indices of the target's hidden states as vLLM reads them (the
  input of layer k, before any norm), in increasing order and each once, as vLLM concatenates them; `fc`'s
  columns are regrouped to match (`vllm_fusion`).
- EAGLE heads with EAGLE-1's options (no input norms, a Llama decoder, the base's lm_head): EAGLE-1's layout, for
  `{"method": "eagle", "model": DIR}`. vLLM 0.32 builds `fc` without a bias and drops a stored one silently, so
  heads whose `fc` has a non-zero bias are refused.

Neither layout stores embeddings: vLLM takes the target's, as these heads do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers import LlamaModel, PreTrainedModel

from hf_specdec.medusa.config import MedusaConfig
from hf_specdec.medusa.eagle3 import Eagle3Heads, layer_config_to_dict
from hf_specdec.medusa.eagle_layouts import (
    EAGLE1_ARCHITECTURE,
    EAGLE3_ARCHITECTURE,
    EAGLE3_QWEN3_ARCHITECTURE,
    LAYER_PREFIXES,
    SPECULATORS_TYPE,
    eagle1_to_published,
    eagle3_to_published,
    published_layer_fields,
)

if TYPE_CHECKING:
    from hf_specdec.medusa.model import MedusaForCausalLM

LAYOUTS = ("published", "speculators")
SPECULATORS_VERSION = "0.3.0"


def check_eagle_exportable(config: MedusaConfig | Any, engine: str, layout: str) -> None:
    """Raise a `ValueError` with the reason when EAGLE heads so configured have no layout `engine` serves.

    Args:
        config (`MedusaConfig`, or any object with its `head_type` and EAGLE fields: the training recipe's own).
        engine (`str`): the engine exported to.
        layout (`str`): one of `LAYOUTS`.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown layout {layout!r}: choose from {LAYOUTS}.")
    kind = "EAGLE-3" if config.head_type == "eagle3" else "EAGLE"
    if engine != "vllm":
        raise ValueError(
            f"{engine} serves Medusa heads only, and these are {kind} heads: serve them with vLLM (--to vllm), whose "
            f"method='{config.head_type}' runs them (docs/serving.md)."
        )
    if config.head_type == "eagle3":
        return
    if getattr(config, "input_norms", True):
        raise ValueError(
            "These are the library's own EAGLE heads: RMS norms scale the token and the feature before their fc, "
            "which makes them neither EAGLE-1 (no norms there: vLLM's method='eagle') nor EAGLE-3 (its norms sit "
            "inside the layer, over three fused target layers: method='eagle3'), so no engine computes them. Train "
            "EAGLE-3 heads (--head_type eagle3) to serve them with vLLM; EAGLE-1 drafts loaded from a release "
            "export as EAGLE-1."
        )
    if layout == "speculators":
        raise ValueError("The speculators format holds EAGLE-3 drafts; write EAGLE-1 heads with the published layout.")
    if not config.share_lm_head or config.head_vocab_size is not None:
        raise ValueError(
            "vLLM's EAGLE-1 drafts project with the target's lm_head over the whole vocabulary; these heads have "
            "their own projection or a draft vocabulary, which it has no place for."
        )


def eagle_files(
    model: MedusaForCausalLM, base: PreTrainedModel, base_name: str | None, layout: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config and weights of `model`'s EAGLE heads in `layout`, for the engine to load (see the module's
    docstring); the caller writes them as `config.json` and `model.safetensors`.

    Raises:
        `ValueError`: for EAGLE-1 heads that vLLM would compute otherwise (a non-Llama decoder, a non-zero bias).
    """
    config = model.config
    state = {k: v.detach().to("cpu") for k, v in model.heads.state_dict().items()}
    decoder = getattr(model.heads, "decoder", None)
    if not isinstance(decoder, LlamaModel):
        raise ValueError(
            f"The heads' decoder is a {type(decoder).__name__}; vLLM's EAGLE drafts are Llama layers: load or train "
            "heads with a Llama layer_config."
        )
    layer = model.heads.layer_config if isinstance(model.heads, Eagle3Heads) else decoder.config
    fields = published_layer_fields(layer_config_to_dict(layer))
    assert config.vocab_size is not None
    if config.head_type == "eagle3":
        return _eagle3(model, base, base_name, layout, fields, state)
    bias = state.get("fc.bias")
    if bias is not None and bool(bias.any()):
        raise ValueError(
            "These EAGLE-1 heads have a bias on fc, which vLLM 0.32 drops without a word (its fc has none): it would "
            "serve another draft. Keep the heads for this library, or serve them where fc.bias is read."
        )
    state.pop("fc.bias", None)
    meta = {
        "architectures": [EAGLE1_ARCHITECTURE],
        **fields,
        "num_hidden_layers": config.num_layers,
        "vocab_size": config.vocab_size,
        "bias": False,
        "base_model_name_or_path": base_name,
    }
    return meta, eagle1_to_published(state)


def _eagle3(
    model: MedusaForCausalLM,
    base: PreTrainedModel,
    base_name: str | None,
    layout: str,
    fields: dict[str, Any],
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config = model.config
    assert config.vocab_size is not None and config.hidden_size is not None
    draft_vocab = config.head_vocab_size or config.vocab_size
    layers = list(model.heads.feature_layers)
    if (config.norm_before_fc or config.fc_norm) and len(set(layers)) < len(layers):
        raise ValueError(
            f"These heads fuse the base's states {layers}, one of them twice, which vLLM takes once each; with "
            "norm_before_fc or fc_norm, the norms see the repeated state twice, so no fc over the states taken once "
            "computes the same: give the heads distinct feature_layers."
        )
    # vLLM concatenates the states in increasing order: the norms' blocks move with fc's (`vllm_fusion`).
    order = sorted(range(len(layers)), key=layers.__getitem__)
    if config.norm_before_fc:
        blocks = state["input_norm.weight"].chunk(len(layers))
        state["input_norm.weight"] = torch.cat([blocks[i] for i in order])
    if config.fc_norm:
        norms = [state.pop(f"fc_norm.{i}.weight") for i in range(len(layers))]
        state |= {f"fc_norm.{j}.weight": norms[i] for j, i in enumerate(order)}
    ids, state["fc.weight"] = vllm_fusion(layers, state["fc.weight"])
    target = None if config.hidden_size == fields["hidden_size"] else config.hidden_size
    prefix = LAYER_PREFIXES["speculators" if layout == "speculators" else "eagle3"]
    weights = eagle3_to_published(state, prefix, config.vocab_size)
    common = {
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": config.norm_before_residual,
        "norm_before_fc": config.norm_before_fc,
        "fc_norm": config.fc_norm,
        "norm_output": config.norm_output,
        **({} if target is None else {"target_hidden_size": target}),
    }
    # vLLM sizes fc's input by `num_aux_hidden_states`, else by `eagle_config`'s ids, else for 3 layers: say it.
    fused = {"num_aux_hidden_states": len(ids)}
    if layout == "speculators":
        verifier = {"name_or_path": base_name, "architectures": list(base.config.architectures or [])}
        meta = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": SPECULATORS_TYPE,
            "speculators_version": SPECULATORS_VERSION,
            "transformer_layer_config": {**fields, "num_hidden_layers": 1, "vocab_size": config.vocab_size, **fused},
            **common,
            "target_hidden_size": target,
            "eagle_aux_hidden_state_layer_ids": ids,
            "speculators_config": {
                "algorithm": SPECULATORS_TYPE,
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": config.num_heads,
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }
                ],
                "default_proposal_method": "greedy",
                "verifier": verifier,
            },
        }
        return meta, weights
    qwen3 = fields["model_type"] == "qwen3"
    meta = {
        "architectures": [EAGLE3_QWEN3_ARCHITECTURE if qwen3 else EAGLE3_ARCHITECTURE],
        **fields,
        "num_hidden_layers": 1,
        "vocab_size": config.vocab_size,
        **common,
        **fused,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "base_model_name_or_path": base_name,
    }
    return meta, weights


def vllm_fusion(feature_layers: list[int], fc: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The fused layers as vLLM takes them, and `fc` for that order: `(layer_ids, fc_weight)`.

    vLLM concatenates the target's states at `sorted(set(eagle_aux_hidden_state_layer_ids))`
    (`SupportsEagle3._set_aux_hidden_state_layers`), whatever order the config gives, while the heads concatenate
    theirs in `feature_layers`' order, a layer possibly twice (the defaults for a target of 6 layers or fewer repeat
    one). So each layer's block of `fc`'s columns moves to its place in increasing order, and the blocks of a
    repeated layer are summed, in float32: `W1 h + W2 h = (W1 + W2) h`. Layers already increasing and distinct
    (the defaults of larger targets) keep `fc` as it is.

    Args:
        feature_layers (`list[int]`): the heads' fused layers, in their order.
        fc (`torch.Tensor` of shape `(hidden, len(feature_layers) * target_hidden)`): the heads' `fc.weight`.
    """
    layer_ids = sorted(set(feature_layers))
    if layer_ids == feature_layers:
        return layer_ids, fc
    blocks = fc.float().chunk(len(feature_layers), dim=1)
    merged = [
        torch.stack([block for block, layer in zip(blocks, feature_layers, strict=True) if layer == wanted]).sum(0)
        for wanted in layer_ids
    ]
    return layer_ids, torch.cat(merged, dim=1).to(fc.dtype)
