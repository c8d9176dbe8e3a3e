"""Tiny random causal LMs with recurrent state (SSMs, linear attention, short convolutions, RG-LRU, RWKV, xLSTM),
one per hybrid / recurrent model type that transformers ships, built from configs (no downloads).

Every hybrid mixes its recurrent layer kind with an attention layer kind, so that both kinds of cache state are
exercised. Chunked scans use small chunks, and sliding windows are shorter than a generation, so that multi-token
forwards cross chunk and window boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import transformers
from transformers import PreTrainedConfig, PreTrainedModel

VOCAB = 96
EOS = 3
PAD = 0
BOS = 1

# Shared by every config: the vocabulary and special tokens of tests/tiny_models.py.
_TOKENS: dict[str, Any] = {"vocab_size": VOCAB, "eos_token_id": EOS, "pad_token_id": PAD, "bos_token_id": BOS}
# Shared by the transformer-style configs: a 4-head, 2-KV-head attention of head size 16.
_ATTENTION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,  # so that sharpening the output layer leaves the input embeddings alone
}
# A sliding window shorter than prompt + generation, so that the window is really exercised.
_WINDOW = 12
# A chunk shorter than a prompt, so that chunked scans cross chunk boundaries.
_CHUNK = 4
# Gated delta net (Qwen3.5 family): 2 key heads, 4 value heads, head size 16, kernel 4.
_GATED_DELTA: dict[str, Any] = {
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}
# A small mixture of experts, for the MoE classes.
_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def _config(name: str, **kwargs: Any) -> PreTrainedConfig:
    return getattr(transformers, name)(**_TOKENS, **kwargs)


def _qwen3_5() -> PreTrainedConfig:
    return _config(
        "Qwen3_5TextConfig",
        **_ATTENTION,
        **_GATED_DELTA,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
    )


def _qwen3_5_moe() -> PreTrainedConfig:
    return _config(
        "Qwen3_5MoeTextConfig",
        **_ATTENTION,
        **_GATED_DELTA,
        **_MOE,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
    )


def _qwen3_next() -> PreTrainedConfig:
    return _config(
        "Qwen3NextConfig",
        **_ATTENTION,
        **_GATED_DELTA,
        **_MOE,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
    )


def _qwen4_exp() -> PreTrainedConfig:
    return _config(
        "Qwen4ExpTextConfig",
        **_ATTENTION,
        **_GATED_DELTA,
        **_MOE,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        layer_types=["linear_attention", "indexed_attention"],
        hc_count=2,
        hc_lowrank=8,
        # The query-sparse-attention indexer: keeps the 2 best blocks of 4 keys, plus the tail, per query.
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=8,
        indexer_compress_ratio=4,
        # Per-layer n-gram embeddings on the linear-attention layer: a third kind of recurrent state.
        ple_layer_ids=[1],
        ple_embed_dim=16,
        ngram_size=3,
        heads_per_ngram=2,
        ngram_vocab_size_base=101,
        make_ngram_vocab_size_divisible_by=8,
        split_ngram_parts=1,
    )


def _mamba(name: str) -> Callable[[], PreTrainedConfig]:
    def build() -> PreTrainedConfig:
        return _config(
            name,
            hidden_size=32,
            num_hidden_layers=2,
            state_size=8,
            expand=2,
            conv_kernel=4,
            time_step_rank=8,
            tie_word_embeddings=False,
        )

    return build


def _mamba2() -> PreTrainedConfig:
    return _config(
        "Mamba2Config",
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=4,
        head_dim=16,
        n_groups=1,
        state_size=8,
        expand=2,
        conv_kernel=4,
        time_step_rank=8,
        chunk_size=_CHUNK,
        tie_word_embeddings=False,
    )


def _jamba() -> PreTrainedConfig:
    return _config(
        "JambaConfig",
        **_ATTENTION,
        num_hidden_layers=2,
        attn_layer_period=2,
        attn_layer_offset=1,  # mamba, attention
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=4,
        num_experts_per_tok=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
    )


# Mamba2 mixers of hidden size 64: 4 heads of 32 (expand 2), one group, state 8, small chunks.
_MAMBA2: dict[str, Any] = {
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_n_groups": 1,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": _CHUNK,
}


def _bamba() -> PreTrainedConfig:
    return _config("BambaConfig", **_ATTENTION, **_MAMBA2, num_hidden_layers=2, attn_layer_indices=[1])


def _falcon_h1() -> PreTrainedConfig:
    # Every Falcon-H1 layer runs attention and a Mamba2 mixer side by side.
    return _config("FalconH1Config", **_ATTENTION, **_MAMBA2, num_hidden_layers=2, mamba_d_ssm=128)


def _granitemoehybrid() -> PreTrainedConfig:
    return _config(
        "GraniteMoeHybridConfig",
        **_ATTENTION,
        **_MAMBA2,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=64,
    )


def _nemotron_h() -> PreTrainedConfig:
    return _config(
        "NemotronHConfig",
        **_ATTENTION,
        hybrid_override_pattern="ME*-",  # mamba2, MoE, attention, MLP
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=32,
        n_groups=1,
        ssm_state_size=8,
        conv_kernel=4,
        expand=2,
        chunk_size=_CHUNK,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
    )


def _zamba() -> PreTrainedConfig:
    return _config(
        "ZambaConfig",
        **_ATTENTION,
        num_hidden_layers=3,
        # "hybrid": the shared attention block, then a mamba layer.
        layers_block_type=["linear_attention", "hybrid", "linear_attention"],
        n_mamba_heads=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
    )


def _zamba2() -> PreTrainedConfig:
    return _config(
        "Zamba2Config",
        **_ATTENTION,
        num_hidden_layers=3,
        # "hybrid": the shared attention block, then a mamba2 layer.
        layers_block_type=["linear_attention", "hybrid", "linear_attention"],
        n_mamba_heads=4,
        mamba_ngroups=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        chunk_size=_CHUNK,
        adapter_rank=8,
    )


def _lfm2() -> PreTrainedConfig:
    return _config(
        "Lfm2Config",
        **_ATTENTION,
        num_hidden_layers=2,
        layer_types=["conv", "full_attention"],
        conv_L_cache=3,
        block_auto_adjust_ff_dim=False,
    )


def _lfm2_moe() -> PreTrainedConfig:
    return _config(
        "Lfm2MoeConfig",
        **_ATTENTION,
        **_MOE,
        num_hidden_layers=2,
        layer_types=["conv", "full_attention"],
        num_dense_layers=1,
        conv_L_cache=3,
    )


def _lfm3() -> PreTrainedConfig:
    return _config(
        "Lfm3Config",
        **_ATTENTION,
        num_hidden_layers=4,
        layer_types=["conv", "sliding_attention", "conv", "full_attention"],
        head_dim=16,
        sliding_window=_WINDOW,
        conv_L_cache=3,
    )


# Multi-head latent attention of the Kimi/Bailing family, with a small KV rank.
_MLA: dict[str, Any] = {
    "kv_lora_rank": 16,
    "q_lora_rank": None,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "num_key_value_heads": 4,
}


def _kimi_linear() -> PreTrainedConfig:
    return _config(
        "KimiLinearConfig",
        **{**_ATTENTION, **_MLA},
        **_MOE,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"],
        linear_head_dim=16,
        linear_num_heads=4,
        linear_conv_kernel_dim=4,
        num_shared_experts=1,
        num_expert_group=1,
        topk_group=1,
    )


def _bailing_hybrid() -> PreTrainedConfig:
    return _config(
        "BailingHybridConfig",
        **{**_ATTENTION, **_MLA},
        **_MOE,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"],
        head_dim=16,  # the linear attention's head size
        short_conv_kernel_size=4,
        num_shared_experts=1,
        num_expert_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        num_nextn_predict_layers=0,
    )


def _olmo_hybrid() -> PreTrainedConfig:
    return _config(
        "OlmoHybridConfig",
        **_ATTENTION,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
    )


def _lara_mini() -> PreTrainedConfig:
    return _config(
        "LaraMiniConfig",
        **_ATTENTION,
        **_GATED_DELTA,
        **_MOE,
        shared_expert_intermediate_size=32,
        num_hidden_layers=3,
        layer_types=["linear_attention", "sliding_attention", "full_attention"],
        sliding_window=_WINDOW,
    )


def _zaya() -> PreTrainedConfig:
    # Each ZAYA layer is compressed convolutional attention: convolution state plus a KV cache.
    return _config(
        "ZayaConfig",
        **_ATTENTION,
        num_hidden_layers=2,
        layer_types=["hybrid", "hybrid_sliding"],
        sliding_window=_WINDOW,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        router_hidden_size=16,
    )


def _minimax() -> PreTrainedConfig:
    return _config(
        "MiniMaxConfig",
        **_ATTENTION,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        block_size=_CHUNK,  # lightning attention's block
    )


def _recurrent_gemma() -> PreTrainedConfig:
    return _config(
        "RecurrentGemmaConfig",
        **_ATTENTION,
        num_hidden_layers=3,
        block_types=["recurrent", "recurrent", "attention"],
        lru_width=64,
        conv1d_width=4,
        attention_window_size=_WINDOW,
    )


def _rwkv() -> PreTrainedConfig:
    return _config(
        "RwkvConfig",
        hidden_size=32,
        attention_hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        context_length=512,
        rescale_every=0,  # no in-place rescaling of the weights at the first eval forward
        tie_word_embeddings=False,
    )


def _xlstm() -> PreTrainedConfig:
    return _config(
        "xLSTMConfig",
        hidden_size=64,
        embedding_dim=64,
        num_hidden_layers=2,
        num_blocks=2,
        num_heads=4,
        qk_dim_factor=1.0,  # with 0.5 (the default), a forward with use_cache=True fails on the state's shape
        chunk_size=_CHUNK,
        autocast_kernel_dtype="float32",
        ffn_round_up_to_multiple_of=16,
        tie_word_embeddings=False,
    )


# model_type -> (causal LM class name, config builder)
_SPECS: dict[str, tuple[str, Callable[[], PreTrainedConfig]]] = {
    "qwen3_5": ("Qwen3_5ForCausalLM", _qwen3_5),
    "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", _qwen3_5_moe),
    "qwen3_next": ("Qwen3NextForCausalLM", _qwen3_next),
    "qwen4_exp": ("Qwen4ExpForCausalLM", _qwen4_exp),
    "mamba": ("MambaForCausalLM", _mamba("MambaConfig")),
    "mamba2": ("Mamba2ForCausalLM", _mamba2),
    "falcon_mamba": ("FalconMambaForCausalLM", _mamba("FalconMambaConfig")),
    "jamba": ("JambaForCausalLM", _jamba),
    "bamba": ("BambaForCausalLM", _bamba),
    "falcon_h1": ("FalconH1ForCausalLM", _falcon_h1),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", _granitemoehybrid),
    "nemotron_h": ("NemotronHForCausalLM", _nemotron_h),
    "zamba": ("ZambaForCausalLM", _zamba),
    "zamba2": ("Zamba2ForCausalLM", _zamba2),
    "lfm2": ("Lfm2ForCausalLM", _lfm2),
    "lfm2_moe": ("Lfm2MoeForCausalLM", _lfm2_moe),
    "lfm3": ("Lfm3ForCausalLM", _lfm3),
    "kimi_linear": ("KimiLinearForCausalLM", _kimi_linear),
    "olmo_hybrid": ("OlmoHybridForCausalLM", _olmo_hybrid),
    "bailing_hybrid": ("BailingHybridForCausalLM", _bailing_hybrid),
    "lara_mini": ("LaraMiniForCausalLM", _lara_mini),
    "zaya": ("ZayaForCausalLM", _zaya),
    "minimax": ("MiniMaxForCausalLM", _minimax),
    "recurrent_gemma": ("RecurrentGemmaForCausalLM", _recurrent_gemma),
    "rwkv": ("RwkvForCausalLM", _rwkv),
    "xlstm": ("xLSTMForCausalLM", _xlstm),
}

RECURRENT_LAYER_KINDS: dict[str, str] = {
    "qwen3_5": "gated delta net + full attention",
    "qwen3_5_moe": "gated delta net + full attention, MoE",
    "qwen3_next": "gated delta net + full attention, MoE",
    "qwen4_exp": "gated delta net + indexed attention, hyper-connections, MoE",
    "mamba": "Mamba SSM",
    "mamba2": "Mamba2 SSM",
    "falcon_mamba": "Mamba SSM (RMS-normed)",
    "jamba": "Mamba SSM + attention, MoE",
    "bamba": "Mamba2 SSM + attention",
    "falcon_h1": "Mamba2 SSM and attention in parallel in every layer",
    "granitemoehybrid": "Mamba2 SSM + attention, MoE",
    "nemotron_h": "Mamba2 SSM + attention + MLP / MoE layers",
    "zamba": "Mamba SSM + shared attention block",
    "zamba2": "Mamba2 SSM + shared attention block",
    "lfm2": "short convolutions + attention",
    "lfm2_moe": "short convolutions + attention, MoE",
    "lfm3": "short convolutions + sliding-window and full attention",
    "kimi_linear": "Kimi delta attention + latent attention, MoE",
    "olmo_hybrid": "gated delta net + full attention",
    "bailing_hybrid": "Kimi delta attention + latent attention, MoE",
    "lara_mini": "gated delta net + sliding-window and full attention, MoE",
    "zaya": "compressed convolutional attention (conv state + KV cache), MoE",
    "minimax": "lightning (linear) attention + full attention, MoE",
    "recurrent_gemma": "RG-LRU + local attention",
    "rwkv": "RWKV time mixing",
    "xlstm": "mLSTM",
}

# What plain `generate()` and transformers' own assisted generation cannot do with these classes (transformers 5.25):
# the rest generate left-padded batches like their unpadded rows, and assisted greedy equals plain greedy.
KNOWN_LIMITATIONS: dict[str, str] = {
    "minimax": "no assisted generation (MiniMaxCache is not croppable); left padding shifts decode logits by ~1e-2",
    "recurrent_gemma": "no Cache object (state lives in the model); no assisted generation",
    "rwkv": "no Cache object; ignores attention_mask; batch > 1 single-token decode returns (B, B, V) logits",
    "xlstm": "xLSTMCache is not a Cache; no assisted generation; ignores attention_mask",
}


def _build(model_type: str) -> PreTrainedModel:
    class_name, make_config = _SPECS[model_type]
    model_cls = getattr(transformers, class_name)
    config = make_config()
    if getattr(model_cls, "_supports_sdpa", False):
        config._attn_implementation = "sdpa"
    return model_cls(config)


def _available(model_type: str) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) == _SPECS[model_type][0] and hasattr(
        transformers, _SPECS[model_type][0]
    )


RECURRENT_ARCHS: dict[str, Callable[[], PreTrainedModel]] = {
    model_type: partial(_build, model_type) for model_type in _SPECS if _available(model_type)
}


def recurrent_model(model_type: str, seed: int, sharpen: float = 4.0) -> PreTrainedModel:
    """A seeded random model of `model_type` in float32, eval mode. `sharpen` scales the output layer so that
    distributions are peakier and generations less uniform."""
    torch.manual_seed(seed)
    model = RECURRENT_ARCHS[model_type]().float().eval()
    if sharpen != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)
    return model
