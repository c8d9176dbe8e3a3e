"""Published EAGLE drafts with random weights, written file by file as their releases are: EAGLE-3 as SafeAILab,
SpecForge and AngelSlim publish it, EAGLE-3 in the speculators format, EAGLE-1 as SafeAILab publishes it (with
`fc.bias` and an `embed_tokens.weight`) and in vLLM's layout. Names, shapes and dtypes follow the releases
(as vLLM 0.32 loads them, and as SafeAILab, SpecForge and speculators save them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 4, 2, 16, 96
VOCAB = 96


def layer_config(**extra) -> dict:
    """A draft's one-layer Llama config as the releases write it (no rope_theta: 10000)."""
    return {
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "model_type": "llama",
        **extra,
    }


def _random(shape: tuple[int, ...], generator: torch.Generator, scale: float = 0.15) -> torch.Tensor:
    return torch.randn(shape, generator=generator) * scale


def _norm(generator: torch.Generator) -> torch.Tensor:
    return 1.0 + 0.2 * torch.randn(HIDDEN, generator=generator)


def _layer(prefix: str, width: int, generator: torch.Generator, input_norm: bool, hidden_norm: bool) -> dict:
    """One Llama layer's weights; q/k/v read `width`."""
    weights = {
        f"{prefix}self_attn.q_proj.weight": _random((HEADS * HEAD_DIM, width), generator),
        f"{prefix}self_attn.k_proj.weight": _random((KV_HEADS * HEAD_DIM, width), generator),
        f"{prefix}self_attn.v_proj.weight": _random((KV_HEADS * HEAD_DIM, width), generator),
        f"{prefix}self_attn.o_proj.weight": _random((HIDDEN, HEADS * HEAD_DIM), generator),
        f"{prefix}mlp.gate_proj.weight": _random((INTERMEDIATE, HIDDEN), generator),
        f"{prefix}mlp.up_proj.weight": _random((INTERMEDIATE, HIDDEN), generator),
        f"{prefix}mlp.down_proj.weight": _random((HIDDEN, INTERMEDIATE), generator),
        f"{prefix}post_attention_layernorm.weight": _norm(generator),
    }
    if input_norm:
        weights[f"{prefix}input_layernorm.weight"] = _norm(generator)
    if hidden_norm:
        weights[f"{prefix}hidden_norm.weight"] = _norm(generator)
    return weights


def draft_vocabulary(size: int, seed: int = 0) -> torch.Tensor:
    """`size` increasing token ids of the target's vocabulary."""
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:size].sort().values


def eagle3_weights(
    token_ids: torch.Tensor | None,
    seed: int = 0,
    layer_prefix: str = "midlayer.",
    qwen3: bool = False,
    norm_before_fc: bool = False,
    fc_norm: bool = False,
) -> dict:
    """EAGLE-3's weights: the layer, fc (H, 3H), norm, lm_head (draft vocabulary, H), d2t (int64), t2d (bool),
    and an embed_tokens.weight (which the releases of some trainers keep); with the variants vLLM serves, a Qwen3
    layer's `self_attn.q_norm` / `k_norm` (head size), `input_norm` (3H) and `fc_norm.{0,1,2}` (H each)."""
    generator = torch.Generator().manual_seed(seed)
    rows = VOCAB if token_ids is None else token_ids.numel()
    weights = {
        **_layer(layer_prefix, 2 * HIDDEN, generator, input_norm=True, hidden_norm=True),
        "fc.weight": _random((HIDDEN, 3 * HIDDEN), generator),
        "norm.weight": _norm(generator),
        "lm_head.weight": _random((rows, HIDDEN), generator, scale=1.0),
        "embed_tokens.weight": _random((VOCAB, HIDDEN), generator),
    }
    if qwen3:
        for name in ("q_norm", "k_norm"):
            weights[f"{layer_prefix}self_attn.{name}.weight"] = 1.0 + 0.3 * torch.randn(HEAD_DIM, generator=generator)
    if norm_before_fc:
        weights["input_norm.weight"] = 1.0 + 0.3 * torch.randn(3 * HIDDEN, generator=generator)
    if fc_norm:
        for i in range(3):
            weights[f"fc_norm.{i}.weight"] = _norm(generator)
    if token_ids is not None:
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[token_ids] = True
        weights |= {"d2t": token_ids - torch.arange(token_ids.numel()), "t2d": t2d}
    return weights


def write_eagle3(
    folder: Path,
    token_ids: torch.Tensor | None,
    layer_ids: list[int] | None = None,
    seed: int = 0,
    weights: dict | None = None,
    pickled: bool = False,
    architecture: str = "LlamaForCausalLMEagle3",
    **options,
) -> dict:
    """An EAGLE-3 release (`LlamaForCausalLMEagle3`, or `architecture`) in `folder`, with the variant `options`
    (`norm_before_fc`, `fc_norm`, `norm_output`: config fields, and their weights); returns its weights. A Qwen3
    layer for `Eagle3Qwen3ForCausalLM` (`model_type` qwen3, q_norm and k_norm)."""
    folder.mkdir(parents=True, exist_ok=True)
    qwen3 = architecture == "Eagle3Qwen3ForCausalLM"
    if weights is None:
        weights = eagle3_weights(
            token_ids,
            seed,
            qwen3=qwen3,
            norm_before_fc=options.get("norm_before_fc", False),
            fc_norm=options.get("fc_norm", False),
        )
    config = layer_config(
        architectures=[architecture],
        draft_vocab_size=VOCAB if token_ids is None else token_ids.numel(),
        **({"model_type": "qwen3", "head_dim": HEAD_DIM} if qwen3 else {}),
        **options,
    )
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True}
    (folder / "config.json").write_text(json.dumps(config))
    _save(weights, folder, pickled)
    return weights


def write_speculators(
    folder: Path,
    token_ids: torch.Tensor,
    layer_ids: list[int] | None,
    norm_before_residual: bool,
    seed: int = 0,
    qwen3: bool = False,
    **options,
) -> dict:
    """An EAGLE-3 draft in the speculators format in `folder` (`layers.0.*`; a Qwen3 layer with `qwen3`, the
    variant `options` as for `write_eagle3`); returns its weights."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = eagle3_weights(
        token_ids,
        seed,
        layer_prefix="layers.0.",
        qwen3=qwen3,
        norm_before_fc=options.get("norm_before_fc", False),
        fc_norm=options.get("fc_norm", False),
    )
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": layer_config(**({"model_type": "qwen3", "head_dim": HEAD_DIM} if qwen3 else {})),
        **options,
        "draft_vocab_size": token_ids.numel(),
        "norm_before_residual": norm_before_residual,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": layer_ids,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None, "architectures": ["LlamaForCausalLM"]},
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    _save(weights, folder, pickled=False)
    return weights


def eagle1_weights(seed: int = 0, bias: bool = True) -> dict:
    """EAGLE-1's weights: fc (H, 2H) over [embedding; feature] (with a bias in the Llama-2 and Vicuna releases),
    one layer without input_layernorm, an (untrained) embed_tokens.weight."""
    generator = torch.Generator().manual_seed(seed)
    weights = {
        **_layer("layers.0.", HIDDEN, generator, input_norm=False, hidden_norm=False),
        "fc.weight": _random((HIDDEN, 2 * HIDDEN), generator),
        "embed_tokens.weight": _random((VOCAB, HIDDEN), generator),
    }
    if bias:
        weights["fc.bias"] = _random((HIDDEN,), generator)
    return weights


def write_eagle1(folder: Path, weights: dict, pickled: bool = True) -> dict:
    """An EAGLE-1 release in `folder` (`pytorch_model.bin`, as SafeAILab's; safetensors with `pickled=False`)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = layer_config(architectures=["LlamaForCausalLM"], bias="fc.bias" in weights, rms_norm_eps=1e-6)
    (folder / "config.json").write_text(json.dumps(config))
    _save(weights, folder, pickled)
    return weights


def _save(weights: dict, folder: Path, pickled: bool) -> None:
    weights = {k: v.contiguous() for k, v in weights.items()}
    if pickled:
        torch.save(weights, folder / "pytorch_model.bin")
    else:
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
