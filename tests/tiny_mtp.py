"""Tiny random models with multi-token-prediction layers attached (DeepSeek-V3, GLM-4-MoE, ERNIE-4.5-MoE, Mellum),
built from configs."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_layers import MtpModel

from hf_specdec.mtp.layers import attach_mtp

PAD = 0
ARCHITECTURES = {
    "glm4_moe": {
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "head_dim": 8,
    },
    "deepseek_v3": {
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 8,
        "qk_rope_head_dim": 4,
        "qk_nope_head_dim": 4,
        "v_head_dim": 8,
        "num_key_value_heads": 4,  # multi-head latent attention: as many key/value heads as query heads
    },
    "ernie4_5_moe": {
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_intermediate_size": 16,
        "moe_layer_start_index": 1,
        "head_dim": 8,
    },
    "mellum": {  # its MTP layer attends through a sliding window
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "head_dim": 8,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
    },
}


def tiny_mtp_model(
    architecture: str, num_mtp_layers: int, vocab: int, seed: int = 0, **overrides: Any
) -> PreTrainedModel:
    """A seeded random float32 model of `architecture` with `num_mtp_layers` random MTP layers attached
    (`overrides`: config fields)."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        architecture,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_mtp_layers=num_mtp_layers,
        max_position_embeddings=256,
        pad_token_id=PAD,
        eos_token_id=None,  # rows run to the length limit unless a test sets an EOS
        **{"num_attention_heads": 4, "num_key_value_heads": 2, **ARCHITECTURES[architecture], **overrides},
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    mtp = MtpModel(model, num_mtp_layers).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # MtpModel leaves some weights (the experts') uninitialised
        for parameter in mtp.layers.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1 + 0.1 * noise if parameter.dim() == 1 else 0.3 * noise)
    attach_mtp(model, mtp)
    return model
