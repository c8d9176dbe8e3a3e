"""A second differential fuzzer: random MODELS and INPUTS (tests/fuzz_cases.py fuzzes the GenerationConfig surface).

Each case draws, from a seed:

- a tiny target built from a config with random weights: one of many decoder-only architectures transformers
  installs (Llama, Qwen2/3, Mistral, Mixtral, Gemma 1/2/3, Phi, Phi3, GPT-2, GPT-BigCode, GPT-Neo, GPT-NeoX,
  GPT-J, CodeGen, OPT, Falcon, BioGPT, Bloom, OLMo 1/2, StarCoder2, StableLM, Persimmon, Cohere 1/2, Granite,
  SmolLM3, Helium, GLM), with random rope types and scalings (default, linear, dynamic, yarn, longrope, llama3,
  proportional), position limits close to the text's length, sliding windows and layer-type mixes, tied or untied
  embeddings, vocabularies padded past the tokenizer's, attention implementations and dtypes;
- inputs: 1-4 rows, left / right / interior padding or none, with or without an attention mask, prompts from one
  token to the position limit, special tokens inside prompts, rows that are all padding, pad == eos, lengths at the
  limits, EOS ids that the model really emits;
- a drafter per path (`PATHS`): a draft model (another random architecture, or a noisy twin of the target, with its
  own position limit, vocabulary size and dtype) drafting chains or trees, prompt lookup (up to 10**6 tokens), both,
  the target's own first layers (`assistant_early_exit=`, chains or trees, with or without lookup), a draft of
  another vocabulary drafting through text (word-level tokenizers sharing part of their words), and random
  untrained heads of every head type (Medusa, recurrent, EAGLE) with static, dynamic and lookup trees, and a
  target's own multi-token-prediction layers (`use_mtp=True`, chains or trees, on the architectures that declare
  them: `tests/fuzz_mtp.py`); always with fixed `speculative_costs`, so that a case is deterministic.

The property (`run_case`): on a float32 target the speculative output equals plain greedy `generate()`'s token for
token, or the call raises a ValueError / TypeError whose message docs/refusals.md lists for the path
(`tests.documented_refusals`); when plain `generate()` raises, the speculative call must raise a ValueError /
TypeError too. A bfloat16 target is only held to "no crash". Everything
in a `Case` is JSON (`Case.to_json`), so any case reruns from its record (`Case.from_json`, `reproducer`).

    from tests.fuzz_models import draw_case, run_case
    result = run_case(draw_case("hybrid", "0:hybrid:17"))
    result.outcome   # "same", "refused: ValueError: ...", "UNDOCUMENTED refusal: ...", "DIFFERENT: ...", "CRASH: ..."

Long runs: `python tools/fuzz_models.py --cases-per-path N --seed S --out results.jsonl`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerFast
from transformers import logging as transformers_logging

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from tests.documented_refusals import is_documented
from tests.fuzz_mtp import MTP_WEIGHTS, attach_random_mtp, draw_mtp_options, mtp_config_kwargs
from tests.recurrent_models import _SPECS as RECURRENT_SPECS

PATHS = (
    "assistant",
    "assistant_tree",
    "lookup",
    "hybrid",
    "early_exit",
    "other_tokenizer",
    "medusa",
    "medusa_dynamic",
    "medusa_lookup",
    "mtp",
)
MAX_LOOKUP = 10**6  # the largest prompt_lookup_num_tokens / num_assistant_tokens drawn (memory)

# ---------------------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------------------


# Models with recurrent layers (`tests.recurrent_models`): hybrids of attention with linear attention, Mamba or
# short convolutions, and state space models; Zamba's states are not recorded by transformers (refused).
HYBRIDS = (
    "qwen3_5", "qwen3_5_moe", "qwen3_next", "mamba2", "falcon_mamba", "jamba", "bamba", "falcon_h1",
    "granitemoehybrid", "nemotron_h", "zamba", "zamba2", "lfm2_moe", "lfm3", "kimi_linear", "olmo_hybrid",
    "bailing_hybrid", "lara_mini",
)  # fmt: skip


@dataclass(frozen=True)
class Arch:
    config: str  # transformers config class
    model: str  # its causal LM class
    family: str  # how its config spells sizes: "llama", "gpt2", "gptj", "opt", "falcon", "gpt_neo", "bloom"
    rope: bool = False  # takes `rope_parameters`
    partial: float | None = None  # the partial rotary factor its rope parameters carry
    kv_heads: bool = True  # takes num_key_value_heads
    head_dim: bool = False  # takes head_dim (and needs it: its default is not hidden / heads)
    window: str | None = None  # "plain": sliding_window; "qwen": use_sliding_window; "types": layer_types; "neo"
    learned: bool = False  # a learned table of absolute positions
    sdpa: bool = True  # supports attn_implementation="sdpa" (else always "eager")
    eager: bool = True  # runs with attn_implementation="eager" (transformers 5.24's MLA models do not)
    weight: int = 2  # how often it is drawn, relative
    extra: tuple[tuple[str, Any], ...] = ()  # fixed config fields (experts, ...)
    mtp: int = 0  # the most multi-token-prediction layers its config declares (the `mtp` path draws these)


def _recurrent_arch(name: str) -> Arch:
    """A model with recurrent layers, its tiny config from `tests.recurrent_models` (family "recurrent")."""
    model = RECURRENT_SPECS[name][0]
    sdpa = bool(getattr(getattr(transformers, model), "_supports_sdpa", False))
    return Arch(model.replace("ForCausalLM", "Config"), model, "recurrent", kv_heads=False, sdpa=sdpa, weight=1)


_EXPERTS = (("num_local_experts", 4), ("num_experts_per_tok", 2))
_MOE = (("num_experts", 4), ("num_experts_per_tok", 2), ("moe_intermediate_size", 16))
_MLA = (("kv_lora_rank", 16), ("q_lora_rank", 16))  # qk_rope / qk_nope / v head dims follow head_dim
_DEEPSEEK = (*_MLA, *_MOE[1:], ("n_routed_experts", 4), ("n_group", 1), ("topk_group", 1), ("first_k_dense_replace", 1))
_GLM = (*_MOE[1:], ("n_routed_experts", 4), ("n_shared_experts", 1), ("n_group", 1), ("topk_group", 1))
_ERNIE = (("moe_num_experts", 4), ("moe_k", 2), ("moe_intermediate_size", 16), ("moe_layer_start_index", 1))
_INKLING = (*_MOE[1:], ("n_routed_experts", 4), ("n_shared_experts", 1), ("sliding_window_size", 4))

ARCHS: dict[str, Arch] = {
    "llama": Arch("LlamaConfig", "LlamaForCausalLM", "llama", rope=True, weight=6),
    "qwen2": Arch("Qwen2Config", "Qwen2ForCausalLM", "llama", rope=True, window="qwen", weight=4),
    "qwen3": Arch("Qwen3Config", "Qwen3ForCausalLM", "llama", rope=True, head_dim=True, window="qwen"),
    "mistral": Arch("MistralConfig", "MistralForCausalLM", "llama", rope=True, head_dim=True, window="plain", weight=4),
    "mixtral": Arch("MixtralConfig", "MixtralForCausalLM", "llama", rope=True, head_dim=True, window="plain"),
    "gemma": Arch("GemmaConfig", "GemmaForCausalLM", "llama", rope=True, head_dim=True),
    "gemma2": Arch("Gemma2Config", "Gemma2ForCausalLM", "llama", rope=True, head_dim=True, window="types", sdpa=False),
    "gemma3": Arch(
        "Gemma3TextConfig", "Gemma3ForCausalLM", "llama", rope=True, head_dim=True, window="types", weight=3
    ),
    "phi3": Arch("Phi3Config", "Phi3ForCausalLM", "llama", rope=True, window="plain", weight=3),
    "phi": Arch("PhiConfig", "PhiForCausalLM", "llama", rope=True, partial=0.5),
    "gpt_neox": Arch("GPTNeoXConfig", "GPTNeoXForCausalLM", "llama", rope=True, partial=0.25, kv_heads=False),
    "stablelm": Arch("StableLmConfig", "StableLmForCausalLM", "llama", rope=True, partial=0.25),
    "persimmon": Arch("PersimmonConfig", "PersimmonForCausalLM", "llama", rope=True, partial=0.5, kv_heads=False),
    "olmo": Arch("OlmoConfig", "OlmoForCausalLM", "llama", rope=True),
    "olmo2": Arch("Olmo2Config", "Olmo2ForCausalLM", "llama", rope=True),
    "starcoder2": Arch("Starcoder2Config", "Starcoder2ForCausalLM", "llama", rope=True, window="plain"),
    "cohere": Arch("CohereConfig", "CohereForCausalLM", "llama", rope=True),
    "cohere2": Arch("Cohere2Config", "Cohere2ForCausalLM", "llama", rope=True, window="types"),
    "granite": Arch("GraniteConfig", "GraniteForCausalLM", "llama", rope=True),
    "smollm3": Arch("SmolLM3Config", "SmolLM3ForCausalLM", "llama", rope=True, window="qwen"),
    "helium": Arch("HeliumConfig", "HeliumForCausalLM", "llama", rope=True, head_dim=True),
    "glm": Arch("GlmConfig", "GlmForCausalLM", "llama", rope=True, head_dim=True, partial=0.5),
    "falcon": Arch("FalconConfig", "FalconForCausalLM", "falcon", rope=True, kv_heads=False),
    "gpt2": Arch("GPT2Config", "GPT2LMHeadModel", "gpt2", learned=True, kv_heads=False, weight=6),
    "gpt_bigcode": Arch("GPTBigCodeConfig", "GPTBigCodeForCausalLM", "gpt2", learned=True, kv_heads=False),
    "gpt_neo": Arch(
        "GPTNeoConfig", "GPTNeoForCausalLM", "gpt_neo", learned=True, kv_heads=False, window="neo", sdpa=False
    ),
    "opt": Arch("OPTConfig", "OPTForCausalLM", "opt", learned=True, kv_heads=False, weight=3),
    "biogpt": Arch("BioGptConfig", "BioGptForCausalLM", "opt", learned=True, kv_heads=False, weight=1),
    "gptj": Arch("GPTJConfig", "GPTJForCausalLM", "gptj", kv_heads=False),
    "codegen": Arch("CodeGenConfig", "CodeGenForCausalLM", "gptj", kv_heads=False, weight=1),
    "bloom": Arch("BloomConfig", "BloomForCausalLM", "bloom", kv_heads=False, sdpa=False, weight=1),  # ALiBi: refused
    # Mixtures of experts, latent attention (MLA), attention sinks, and more of the llama family.
    "qwen2_moe": Arch("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "llama", rope=True, window="qwen", weight=1, extra=_MOE),
    "qwen3_moe": Arch("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "llama", rope=True, head_dim=True, weight=1, extra=_MOE),
    "olmoe": Arch("OlmoeConfig", "OlmoeForCausalLM", "llama", rope=True, weight=1, extra=_MOE),
    "granitemoe": Arch("GraniteMoeConfig", "GraniteMoeForCausalLM", "llama", rope=True, weight=1, extra=_EXPERTS),
    "phimoe": Arch("PhimoeConfig", "PhimoeForCausalLM", "llama", rope=True, window="plain", weight=1, extra=_EXPERTS),
    "deepseek_v3": Arch(
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        "llama",
        rope=True,
        kv_heads=False,
        eager=False,
        weight=2,
        extra=_DEEPSEEK,
        mtp=3,
    ),
    "minicpm3": Arch(
        "MiniCPM3Config", "MiniCPM3ForCausalLM", "llama", rope=True, kv_heads=False, eager=False, weight=1, extra=_MLA
    ),
    "exaone4": Arch("Exaone4Config", "Exaone4ForCausalLM", "llama", rope=True, window="types", weight=1),
    "gpt_oss": Arch(
        "GptOssConfig",
        "GptOssForCausalLM",
        "llama",
        rope=True,
        head_dim=True,
        window="types",
        sdpa=False,
        weight=2,
        extra=_EXPERTS,
    ),
    "ernie4_5": Arch("Ernie4_5Config", "Ernie4_5ForCausalLM", "llama", rope=True, head_dim=True, weight=1),
    "hunyuan": Arch("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", "llama", rope=True, head_dim=True, weight=1),
    "seed_oss": Arch("SeedOssConfig", "SeedOssForCausalLM", "llama", rope=True, head_dim=True, weight=1),
    "apertus": Arch("ApertusConfig", "ApertusForCausalLM", "llama", rope=True, weight=1),
    "diffllama": Arch("DiffLlamaConfig", "DiffLlamaForCausalLM", "llama", rope=True, weight=1),
    "nemotron": Arch("NemotronConfig", "NemotronForCausalLM", "llama", rope=True, partial=0.5, weight=1),
    "lfm2": Arch("Lfm2Config", "Lfm2ForCausalLM", "llama", rope=True, weight=1),  # with conv layers or not
    # Position tables: learned (GPT-1), sinusoidal of a fixed size (CTRL), sinusoidal that grows (XGLM).
    "openai": Arch(
        "OpenAIGPTConfig", "OpenAIGPTLMHeadModel", "gpt2", learned=True, kv_heads=False, sdpa=False, weight=1
    ),
    "ctrl": Arch("CTRLConfig", "CTRLLMHeadModel", "gpt2", learned=True, kv_heads=False, weight=1),
    "xglm": Arch("XGLMConfig", "XGLMForCausalLM", "xglm", kv_heads=False, sdpa=False, weight=1),
    # Recurrent state: a state space model (Mamba), and below every hybrid; refused by design: ALiBi (MPT).
    "mamba": Arch("MambaConfig", "MambaForCausalLM", "mamba", kv_heads=False, sdpa=False, weight=1),
    "mpt": Arch("MptConfig", "MptForCausalLM", "mpt", kv_heads=False, sdpa=False, weight=1),
    **{name: _recurrent_arch(name) for name in HYBRIDS},
    # With multi-token-prediction layers: drawn by the `mtp` path alone (weight 0 here; `fuzz_mtp.MTP_WEIGHTS`).
    "glm4_moe": Arch(
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        "llama",
        rope=True,
        head_dim=True,
        partial=0.5,
        weight=0,
        extra=_GLM,
        mtp=3,
    ),
    "param2moe": Arch(
        "Param2MoeConfig", "Glm4MoeForCausalLM", "llama", rope=True, head_dim=True, weight=0, extra=_GLM, mtp=2
    ),
    "sarvam_moe": Arch(
        "SarvamMoEConfig", "Glm4MoeForCausalLM", "llama", rope=True, head_dim=True, weight=0, extra=_GLM, mtp=2
    ),
    "sarvam_mla": Arch(
        "SarvamMLAConfig",
        "DeepseekV3ForCausalLM",
        "llama",
        rope=True,
        kv_heads=False,
        eager=False,
        weight=0,
        extra=_DEEPSEEK,
        mtp=2,
    ),
    "ernie4_5_moe": Arch(
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        "llama",
        rope=True,
        head_dim=True,
        weight=0,
        extra=_ERNIE,
        mtp=1,
    ),
    "mellum": Arch(
        "MellumConfig",
        "MellumForCausalLM",
        "llama",
        rope=True,
        head_dim=True,
        window="types",
        weight=0,
        extra=_MOE,
        mtp=1,
    ),
    "inkling": Arch("InklingTextConfig", "InklingForCausalLM", "llama", head_dim=True, weight=0, extra=_INKLING, mtp=2),
}


@dataclass
class ModelSpec:
    """A tiny random model, everything JSON: the config's fields are derived from these in `config_kwargs`."""

    arch: str
    seed: int
    heads: int
    head_dim: int
    kv_heads: int
    layers: int
    rows: int  # vocab_size: embedding and output rows (>= the tokenizer's size when padded)
    positions: int  # max_position_embeddings / n_positions
    bos: int | None
    eos: int | None
    pad: int | None
    rope: dict[str, Any] | None = None  # rope_parameters (by layer type for Gemma3, see `options["sliding_rope"]`)
    window: int | None = None
    layer_types: list[str] | None = None
    tied: bool = True
    dtype: str = "float32"
    sharpen: float = 4.0
    init: float = 0.02  # initializer_range
    attn: str = "sdpa"
    options: dict[str, Any] = field(default_factory=dict)  # architecture-specific switches

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


def config_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """The keyword arguments of the spec's transformers config class."""
    arch = ARCHS[spec.arch]
    o = spec.options
    kw: dict[str, Any] = {
        "vocab_size": spec.rows,
        "bos_token_id": spec.bos,
        "eos_token_id": spec.eos,
        "pad_token_id": spec.pad,
        "tie_word_embeddings": spec.tied,
        "attn_implementation": spec.attn,
    }
    hidden = spec.hidden
    if arch.family in ("llama", "falcon", "opt", "gpt_neo", "bloom"):
        kw["hidden_size"] = hidden
    if arch.family == "llama":
        kw.update(
            intermediate_size=2 * hidden,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            max_position_embeddings=spec.positions,
            initializer_range=spec.init,
        )
        if arch.kv_heads:
            kw["num_key_value_heads"] = spec.kv_heads
        if arch.head_dim:
            kw["head_dim"] = spec.head_dim
        kw.update(dict(arch.extra))
        if ("kv_lora_rank", 16) in arch.extra:
            kw.update(qk_rope_head_dim=spec.head_dim, qk_nope_head_dim=spec.head_dim, v_head_dim=spec.head_dim)
        if spec.arch == "qwen2_moe":
            kw["shared_expert_intermediate_size"] = 16
        if spec.arch == "lfm2":
            kw["layer_types"] = o.get("lfm2_layers", ["full_attention"] * spec.layers)
        if spec.arch == "inkling":  # its sliding-window layers' heads
            kw.update(swa_num_attention_heads=spec.heads, swa_num_key_value_heads=spec.kv_heads)
            kw["swa_head_dim"] = spec.head_dim
        kw.update(mtp_config_kwargs(spec.arch, o))
    elif arch.family == "gpt2":
        kw.update(n_embd=hidden, n_layer=spec.layers, n_head=spec.heads, n_positions=spec.positions)
        kw["initializer_range"] = spec.init
        if spec.arch == "ctrl":
            kw["dff"] = 2 * hidden
        if spec.arch == "gpt_bigcode":
            kw["multi_query"] = o.get("multi_query", True)
    elif arch.family == "gptj":
        kw.update(n_embd=hidden, n_layer=spec.layers, n_head=spec.heads, n_positions=spec.positions)
        kw["rotary_dim"] = o.get("rotary_dim", spec.head_dim)
        kw["initializer_range"] = spec.init
        if spec.arch == "codegen":
            kw["n_ctx"] = spec.positions
    elif arch.family == "opt":
        kw.update(num_hidden_layers=spec.layers, num_attention_heads=spec.heads, max_position_embeddings=spec.positions)
        if spec.arch == "opt":
            kw.update(ffn_dim=2 * hidden, word_embed_proj_dim=o.get("proj", hidden))
            kw["do_layer_norm_before"] = o.get("norm_before", True)
            kw["init_std"] = spec.init
        else:
            kw.update(intermediate_size=2 * hidden, scale_embedding=o.get("scale_embedding", True))
            kw["initializer_range"] = spec.init
    elif arch.family == "falcon":
        kw.update(num_hidden_layers=spec.layers, num_attention_heads=spec.heads, max_position_embeddings=spec.positions)
        kw.update(
            alibi=o.get("alibi", False),
            new_decoder_architecture=o.get("new_arch", False),
            multi_query=o.get("multi_query", True),
            parallel_attn=o.get("parallel_attn", True),
            bias=o.get("bias", False),
            initializer_range=spec.init,
        )
        if o.get("new_arch"):
            kw["num_kv_heads"] = spec.kv_heads
    elif arch.family == "gpt_neo":
        half = spec.layers // 2
        pattern = [[["global", "local"], half]] if spec.layers % 2 == 0 else [[["global"], spec.layers]]
        if spec.window is not None and spec.layers % 2 == 1:
            pattern = [[["local"], spec.layers]]
        kw.update(
            num_layers=spec.layers,
            num_heads=spec.heads,
            attention_types=pattern,
            window_size=spec.window or 256,
            max_position_embeddings=spec.positions,
            initializer_range=spec.init,
        )
    elif arch.family == "bloom":
        kw.update(n_layer=spec.layers, n_head=spec.heads, initializer_range=spec.init)
    elif arch.family == "xglm":
        kw.update(d_model=hidden, num_layers=spec.layers, attention_heads=spec.heads, ffn_dim=2 * hidden)
        kw.update(max_position_embeddings=spec.positions, init_std=spec.init)
    elif arch.family == "mamba":
        kw.update(hidden_size=hidden, num_hidden_layers=spec.layers, state_size=4, initializer_range=spec.init)
    elif arch.family == "mpt":
        kw.update(d_model=hidden, n_heads=spec.heads, n_layers=spec.layers, max_seq_len=spec.positions)
    # Rotary settings.
    if arch.rope and spec.rope is not None and not o.get("alibi"):
        rope = dict(spec.rope)
        if spec.arch in ("gemma3", "mellum"):  # rope parameters by layer type
            sliding = o.get("sliding_rope") or {"rope_type": "default", "rope_theta": 10000.0}
            kw["rope_parameters"] = {"full_attention": rope, "sliding_attention": dict(sliding)}
        else:
            kw["rope_parameters"] = rope
    # Sliding windows.
    if arch.window == "plain":
        kw["sliding_window"] = spec.window
    elif arch.window == "qwen":
        kw["use_sliding_window"] = spec.window is not None
        kw["sliding_window"] = spec.window
        if spec.arch != "smollm3":
            kw["max_window_layers"] = o.get("max_window_layers", 0)
        if spec.arch == "smollm3" and "no_rope_layers" in o:
            kw["no_rope_layers"] = o["no_rope_layers"]
    elif arch.window == "types":
        kw["sliding_window"] = spec.window or 4096
        kw["layer_types"] = spec.layer_types or ["full_attention"] * spec.layers
    # Other switches.
    if spec.arch == "mixtral":
        kw.update(num_local_experts=o.get("experts", 2), num_experts_per_tok=o.get("per_token", 1))
    if spec.arch == "stablelm":
        kw.update(use_qkv_bias=o.get("qkv_bias", False), qk_layernorm=o.get("qk_norm", False))
        kw["use_parallel_residual"] = o.get("parallel", False)
    if spec.arch == "gemma2" or spec.arch == "gemma3":
        kw["query_pre_attn_scalar"] = spec.head_dim
        if o.get("softcap"):
            kw.update(attn_logit_softcapping=o["softcap"], final_logit_softcapping=o["softcap"])
    if spec.arch == "phi" and o.get("qk_norm"):
        kw["qk_layernorm"] = True
    if spec.arch == "gpt_neox":
        kw["use_parallel_residual"] = o.get("parallel", True)
    if spec.arch == "granite":
        kw.update(embedding_multiplier=2.0, logits_scaling=o.get("logits_scaling", 1.0), residual_multiplier=0.5)
    return kw


def make_config(spec: ModelSpec) -> transformers.PretrainedConfig:
    if ARCHS[spec.arch].family == "recurrent":
        return _recurrent_config(spec)
    with quiet():
        return getattr(transformers, ARCHS[spec.arch].config)(**config_kwargs(spec))


def _recurrent_config(spec: ModelSpec) -> transformers.PretrainedConfig:
    """A hybrid's or state space model's tiny config (`tests.recurrent_models`) with the spec's vocabulary, special
    tokens, position limit, tying and attention."""
    with quiet():
        config = RECURRENT_SPECS[spec.arch][1]()
    config.vocab_size = spec.rows
    config.bos_token_id, config.eos_token_id, config.pad_token_id = spec.bos, spec.eos, spec.pad
    config.tie_word_embeddings = spec.tied and spec.arch != "zamba"  # transformers cannot tie Zamba's shared layers
    if hasattr(config, "max_position_embeddings"):
        config.max_position_embeddings = spec.positions
    config._attn_implementation = spec.attn
    return config


def build_model(spec: ModelSpec) -> PreTrainedModel:
    """The spec's model: seeded random weights, output layer scaled by `sharpen`, in its dtype, eval mode."""
    config = make_config(spec)
    torch.manual_seed(spec.seed)
    with quiet():
        model = getattr(transformers, ARCHS[spec.arch].model)(config).eval()
    if spec.sharpen != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(spec.sharpen)
    model = model.to(getattr(torch, spec.dtype))
    attach_random_mtp(model, spec.options)
    return model


# ---------------------------------------------------------------------------------------------------------
# Drawing models
# ---------------------------------------------------------------------------------------------------------


def _weighted(rng: random.Random, options: dict[Any, int]) -> Any:
    keys = list(options)
    return rng.choices(keys, weights=[options[k] for k in keys])[0]


def _draw_rope(rng: random.Random, arch: Arch, head_dim: int, positions: int) -> dict[str, Any]:
    theta = rng.choice([10000.0, 10000.0, 500.0, 1e6])
    kinds = {"default": 6, "linear": 2, "dynamic": 3, "yarn": 2, "longrope": 3, "llama3": 2, "proportional": 1}
    if arch.partial is not None:
        del kinds["proportional"]  # rotates the whole head, where these models rotate part of it: invalid
    kind = _weighted(rng, kinds)
    rope: dict[str, Any] = {"rope_type": kind, "rope_theta": theta}
    partial = arch.partial if arch.partial is not None else 1.0
    if arch.partial is not None:
        rope["partial_rotary_factor"] = arch.partial
    original = rng.randint(4, max(4, positions))
    if kind in ("linear", "dynamic"):
        rope["factor"] = rng.choice([1.0, 1.5, 2.0, 4.0])
    elif kind == "yarn":
        rope.update(factor=rng.choice([2.0, 4.0]), original_max_position_embeddings=original)
        if rng.random() < 0.3:
            rope.update(beta_fast=rng.choice([8.0, 32.0]), beta_slow=1.0)
    elif kind == "longrope":
        half = int(head_dim * partial) // 2
        rope["short_factor"] = [round(rng.uniform(1.0, 1.5), 3) for _ in range(half)]
        rope["long_factor"] = [round(rng.uniform(1.0, 8.0), 3) for _ in range(half)]
        rope["original_max_position_embeddings"] = original
        if rng.random() < 0.5:
            rope["factor"] = rng.choice([2.0, 4.0])
    elif kind == "llama3":
        rope.update(factor=rng.choice([2.0, 8.0]), low_freq_factor=1.0, high_freq_factor=4.0)
        rope["original_max_position_embeddings"] = original
    elif kind == "proportional":
        rope["partial_rotary_factor"] = rng.choice([0.25, 0.5])
    return rope


def draw_model_spec(
    rng: random.Random,
    rows: int,
    specials: tuple[int | None, int | None, int | None],
    arch_name: str | None = None,
    draft: bool = False,
    mtp: bool = False,
) -> ModelSpec:
    """A random model spec whose config builds (redrawn otherwise); with `mtp`, of an architecture with
    multi-token-prediction layers, some attached."""
    for _ in range(50):
        name = arch_name or _weighted(rng, MTP_WEIGHTS if mtp else {n: a.weight for n, a in ARCHS.items()})
        arch = ARCHS[name]
        heads = rng.choice([2, 4])
        head_dim = rng.choice([8, 16] if heads == 4 else [8, 16, 16])
        if name in ("falcon", "bloom", "gpt_neo", "gpt2", "gpt_bigcode", "opt", "biogpt", "gptj", "codegen"):
            head_dim = rng.choice([8, 16])
        kv = rng.choice([h for h in (1, 2, heads) if heads % h == 0]) if arch.kv_heads else heads
        positions = _weighted(rng, {rng.randint(4, 24): 3, rng.randint(24, 64): 3, rng.randint(64, 160): 2, 512: 2})
        bos, eos, pad = specials
        spec = ModelSpec(
            arch=name,
            seed=rng.randint(0, 10**6),
            heads=heads,
            head_dim=head_dim,
            kv_heads=kv,
            layers=rng.choice([1, 1, 2, 2, 3]) if not draft else rng.choice([1, 1, 2]),
            rows=rows,
            positions=positions,
            bos=bos,
            eos=eos,
            pad=pad,
            tied=rng.random() < 0.5,
            sharpen=rng.choice([1.0, 4.0, 4.0, 8.0]),
            init=rng.choice([0.02, 0.1, 0.3]),  # larger: peakier attention, where mask errors show
            attn="eager" if (rng.random() < 0.2 and arch.eager) or not arch.sdpa else "sdpa",
        )
        o = spec.options
        if arch.rope and rng.random() < 0.7:
            spec.rope = _draw_rope(rng, arch, head_dim, positions)
            if name == "gemma3" and rng.random() < 0.5:
                o["sliding_rope"] = _draw_rope(rng, arch, head_dim, positions)
        if arch.window and rng.random() < 0.6:
            spec.window = rng.randint(1, 24)
            if arch.window == "types":
                spec.layer_types = [rng.choice(["sliding_attention", "full_attention"]) for _ in range(spec.layers)]
            if arch.window == "qwen" and name != "smollm3":
                o["max_window_layers"] = rng.randint(0, spec.layers)
        if name == "lfm2" and rng.random() < 0.5:
            o["lfm2_layers"] = [rng.choice(["conv", "full_attention"]) for _ in range(spec.layers)]
        if name == "smollm3" and rng.random() < 0.5:
            o["no_rope_layers"] = [rng.randint(0, 1) for _ in range(spec.layers)]
        if name == "mixtral":
            o.update(experts=rng.choice([2, 4]), per_token=rng.choice([1, 2]))
        if name == "falcon":
            o.update(alibi=rng.random() < 0.15, new_arch=rng.random() < 0.3, multi_query=rng.random() < 0.5)
            o.update(parallel_attn=o["new_arch"] or rng.random() < 0.7, bias=rng.random() < 0.3)
        if name == "opt":
            o.update(
                proj=rng.choice([spec.hidden, spec.hidden, max(8, spec.hidden // 2)]), norm_before=rng.random() < 0.8
            )
        if name in ("gptj", "codegen"):
            o["rotary_dim"] = rng.choice([d for d in (2, 4, head_dim // 2, head_dim) if d <= head_dim])
        if name in ("gemma2", "gemma3") and rng.random() < 0.4:
            o["softcap"] = rng.choice([5.0, 30.0])
        if name == "stablelm":
            o.update(qkv_bias=rng.random() < 0.5, qk_norm=rng.random() < 0.5, parallel=rng.random() < 0.5)
        if name in ("phi",) and rng.random() < 0.3:
            o["qk_norm"] = True
        if name == "gpt_bigcode":
            o["multi_query"] = rng.random() < 0.5
        if name == "granite":
            o["logits_scaling"] = rng.choice([1.0, 4.0])
        if name == "gpt_neox":
            o["parallel"] = rng.random() < 0.5
        if mtp and arch.mtp:
            draw_mtp_options(rng, name, arch.mtp, o)
        if works(spec):
            return spec
        arch_name = arch_name if arch_name and rng.random() < 0.8 else None
    raise RuntimeError("no buildable model spec drawn in 50 tries")


def works(spec: ModelSpec) -> bool:
    """Whether the spec builds and runs a forward over two tokens (some drawn combinations transformers cannot run:
    those are redrawn, they are no test of speculative decoding)."""
    try:
        model = build_model(spec)
        with torch.no_grad(), quiet():
            model(input_ids=torch.tensor([[3, 4]]))
    except Exception:
        return False
    return True


def learned_limit(spec: ModelSpec) -> int | None:
    return spec.positions if ARCHS[spec.arch].learned else None


def rope_limits(spec: ModelSpec) -> list[int]:
    """Lengths where a model's rotary frequencies (or windows) change: the interesting lengths to cross."""
    limits = []
    for rope in (spec.rope, spec.options.get("sliding_rope")):
        if rope:
            limits.append(rope.get("original_max_position_embeddings", spec.positions))
    if spec.window:
        limits.append(spec.window)
    return limits


# ---------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One generate() call on one path, everything JSON."""

    path: str
    seed: str
    tokenizer_size: int
    target: ModelSpec
    input_ids: list[list[int]]
    attention_mask: list[list[int]] | None  # None: no mask passed (transformers infers one from pad_token_id)
    gen: dict[str, Any]  # plain generate()'s arguments; do_sample=False always
    eos_mode: str = "given"  # "given" | "from_output" | "list_from_output": EOS ids the model really emits
    eos_pick: int = 0  # which generated token becomes the EOS id (from_output modes)
    draft: dict[str, Any] | None = None  # {"kind": "model", "spec": {...}} | "twin" | "no_lm_head" | "target"
    tokenizers: bool = False  # pass tokenizer= and assistant_tokenizer=
    # A draft tokenizer of another vocabulary: {"seed", "size", "shared"} (see `draft_tokenizer`).
    draft_vocab: dict[str, Any] | None = None
    heads: dict[str, Any] | None = None  # MedusaConfig fields + noise, seed, token_ids
    path_kwargs: dict[str, Any] = field(default_factory=dict)  # trees encoded, see `_decode_tree`
    costs: list[float] = field(default_factory=lambda: [0.0, 0.0])  # speculative_costs=SpeculativeCosts(*costs)
    # A user's stopping criterion and a recording streamer, compared call by call with plain's (see `Callbacks`).
    callbacks: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        data = dict(data)
        data["target"] = ModelSpec(**data["target"])
        data["costs"] = list(data["costs"])
        return cls(**data)

    def draft_spec(self) -> ModelSpec | None:
        if self.draft and self.draft["kind"] == "model":
            return ModelSpec(**self.draft["spec"])
        return None


def _specials(rng: random.Random, size: int) -> tuple[int | None, int | None, int | None]:
    """(bos, eos, pad) ids: the usual 1, 2, 0, or random ones; pad absent or equal to eos at times."""
    if rng.random() < 0.5:
        bos, eos, pad = 1, 2, 0
    else:
        bos, eos, pad = rng.sample(range(size), 3)
    r = rng.random()
    if r < 0.15:
        pad = None
    elif r < 0.3:
        pad = eos
    if rng.random() < 0.1:
        bos = None
    return bos, eos, pad


def _row(rng: random.Random, length: int, size: int, specials: tuple[int | None, ...], repetitive: bool) -> list[int]:
    ordinary = [t for t in range(size) if t not in specials]
    if repetitive:
        motif = [rng.choice(ordinary) for _ in range(rng.randint(1, 6))]
        row = (motif * (length // len(motif) + 1))[:length]
        for _ in range(rng.randint(0, 2)):
            if row:
                row[rng.randrange(len(row))] = rng.choice(ordinary)
    else:
        row = [rng.choice(ordinary) for _ in range(length)]
    bos, eos, pad = specials
    if row and bos is not None and rng.random() < 0.3:
        row[0] = bos
    if row and eos is not None and rng.random() < 0.1:
        row[rng.randrange(len(row))] = eos  # an EOS id inside (or ending) a prompt
    if row and pad is not None and rng.random() < 0.05:
        row[rng.randrange(len(row))] = pad  # the pad id as a real token
    return row


def _draw_inputs(
    rng: random.Random, case_size: int, rows: int, specials: tuple[int | None, ...], limit: int | None, repetitive: bool
) -> tuple[list[list[int]], list[list[int]] | None, int]:
    """(input_ids, attention_mask or None, prompt width)."""
    batch = rng.choice([1, 1, 2, 2, 3, 4]) if rng.random() < 0.95 else rng.randint(5, 8)
    top = min(limit, 64) if limit is not None else 48
    width = _weighted(
        rng, {rng.randint(1, min(8, top)): 3, rng.randint(1, min(48, top)): 4, top: 1, max(1, top - 1): 1}
    )
    layout = _weighted(rng, {"left": 24, "right": 2, "interior": 4, "none": 6, "left_no_mask": 4, "right_no_mask": 1})
    if layout == "none":
        lengths = [width] * batch
    else:
        lengths = [rng.randint(1, width) for _ in range(batch)]
        lengths[rng.randrange(batch)] = width
        if rng.random() < 0.02:
            lengths[rng.randrange(batch)] = 0  # a row that is all padding (refused)
    _, eos, pad = specials
    pad_value = pad if pad is not None else (eos if eos is not None else 0)
    ids: list[list[int]] = []
    mask: list[list[int]] = []
    garbage = rng.random() < 0.1  # random tokens under the mask's zeros
    for length in lengths:
        row = _row(rng, length, case_size, specials, repetitive)
        if rows > case_size and rng.random() < 0.05 and row:
            row[rng.randrange(len(row))] = rng.randrange(case_size, rows)  # an id past the tokenizer, in the model
        filler = [rng.randrange(case_size) if garbage else pad_value for _ in range(width - length)]
        ones, zeros = [1] * length, [0] * (width - length)
        if layout.startswith("right"):
            ids.append(row + filler)
            mask.append(ones + zeros)
        elif layout == "interior" and length >= 2 and width > length:
            lead, cut = rng.randint(0, len(filler) - 1), rng.randint(1, length - 1)  # >= 1 pad between two parts
            ids.append(filler[:lead] + row[:cut] + filler[lead:] + row[cut:])
            mask.append([0] * lead + [1] * cut + [0] * (len(filler) - lead) + [1] * (length - cut))
        else:
            ids.append(filler + row)
            mask.append(zeros + ones)
    passed = None if layout in ("none", "left_no_mask", "right_no_mask") else mask
    return ids, passed, width


def _draw_tree_paths(rng: random.Random, depth: int) -> list[list[int]]:
    paths: list[list[int]] = []
    frontier: list[list[int]] = [[]]
    for _ in range(rng.randint(1, 10)):
        parent = rng.choice(frontier)
        if len(parent) >= depth:
            continue
        child = [*parent, rng.choice([0, 0, 1, 2])]
        if child not in paths:
            paths.append(child)
            frontier.append(child)
    return paths or [[0]]


def _dynamic_tree(rng: random.Random, max_depth: int = 8, depth_none: bool = False) -> dict[str, Any]:
    top_k = rng.randint(1, 4)
    depth = None if depth_none and rng.random() < 0.3 else rng.randint(1, max_depth)
    most = top_k + ((depth or 2) - 1) * top_k**2
    return {"dynamic_tree": [rng.randint(1, most), depth, top_k]}


def _decode_tree(value: Any) -> Any:
    if isinstance(value, dict) and "dynamic_tree" in value:
        num_nodes, depth, top_k = value["dynamic_tree"]
        return DynamicTree(num_nodes=num_nodes, depth=depth, top_k=top_k)
    return value


def _lookup_kwargs(rng: random.Random, kw: dict[str, Any], schedule: bool = True) -> None:
    kw["prompt_lookup_num_tokens"] = _weighted(
        rng, {rng.randint(1, 10): 8, rng.choice([20, 100]): 1, 1000: 1, MAX_LOOKUP: 1}
    )
    if rng.random() < 0.5:
        kw["max_matching_ngram_size"] = _weighted(rng, {rng.randint(1, 4): 6, 10: 1, MAX_LOOKUP: 1})
    if schedule and rng.random() < 0.4:
        kw["num_assistant_tokens_schedule"] = rng.choice(["constant", "adaptive"])


def _chain_kwargs(rng: random.Random, kw: dict[str, Any]) -> None:
    if rng.random() < 0.6:
        kw["num_assistant_tokens"] = _weighted(rng, {rng.randint(1, 10): 8, 16: 1, 1000: 1, MAX_LOOKUP: 1})
    if rng.random() < 0.6:
        kw["num_assistant_tokens_schedule"] = rng.choice(["constant", "adaptive", "heuristic"])
    if rng.random() < 0.2:
        kw["assistant_confidence_threshold"] = rng.choice([0.1, 0.5, 0.9])


def _draft_vocabulary(rng: random.Random, case: Case, kw: dict[str, Any]) -> None:
    """Sometimes `assistant_vocab=`: the tokens the draft may propose (the target still verifies over all)."""
    if rng.random() < 0.1:
        size = rng.randint(1, case.tokenizer_size)
        kw["assistant_vocab"] = sorted(rng.sample(range(case.tokenizer_size), size))


def _draw_draft(rng: random.Random, case: Case, specials: tuple[int | None, ...]) -> None:
    kind = _weighted(rng, {"model": 10, "twin": 8, "no_lm_head": 1, "target": 1})
    if kind == "model":
        rows = case.target.rows if rng.random() < 0.6 else case.tokenizer_size + rng.randint(0, 40)
        spec = draw_model_spec(rng, rows, specials, draft=True)  # type: ignore[arg-type]
        if rng.random() < 0.15:
            spec.dtype = "bfloat16"
        case.draft = {"kind": "model", "spec": asdict(spec)}
        case.tokenizers = rows != case.target.rows or rng.random() < 0.15
    elif kind == "twin":
        positions = None
        if rng.random() < 0.4:
            positions = rng.randint(2, max(2, case.target.positions))
        case.draft = {
            "kind": "twin",
            "noise": rng.choice([0.0, 1e-3, 0.05, 0.3]),
            "seed": rng.randint(0, 10**6),
            "positions": positions,
            "dtype": "bfloat16" if rng.random() < 0.15 else case.target.dtype,
        }
        case.tokenizers = rng.random() < 0.1
    else:
        case.draft = {"kind": kind}


def _draw_heads(rng: random.Random, case: Case) -> None:
    head_type = _weighted(rng, {"medusa": 3, "recurrent": 3, "eagle": 3, "eagle3": 3})
    heads: dict[str, Any] = {
        "head_type": head_type,
        "num_heads": rng.randint(1, 4),
        "num_layers": {"eagle": rng.randint(1, 2), "eagle3": 1}.get(head_type, rng.randint(0, 2)),
        "share_lm_head": head_type != "eagle3" and rng.random() < 0.6,
        "noise": rng.choice([0.0, 0.3, 1.0]),
        "seed": rng.randint(0, 10**6),
        "token_ids": None,
    }
    if rng.random() < 0.2:
        size = rng.randint(1, case.target.rows)
        heads["token_ids"] = sorted(rng.sample(range(case.target.rows), size))
    if head_type == "eagle3" and rng.random() < 0.3:  # fused layers of its own choosing (the default otherwise)
        heads["feature_layers"] = [rng.randrange(case.target.layers) for _ in range(rng.randint(1, 3))]
    case.heads = heads
    kw = case.path_kwargs
    kw["medusa"] = True
    # Medusa heads draft as deep as they are many (deeper is refused); recurrent and EAGLE heads go further.
    deepest = heads["num_heads"] if head_type == "medusa" and rng.random() < 0.9 else 6
    if case.path == "medusa_dynamic":
        kw["tree"] = "dynamic" if rng.random() < 0.25 else _dynamic_tree(rng, max_depth=deepest, depth_none=True)
        return
    if head_type in ("eagle", "eagle3"):  # EAGLE heads grow their trees: static ones are refused
        tree = _weighted(rng, {"none": 6, "int": 12, "dynamic": 9, "preset": 1, "paths": 1})
    else:
        tree = _weighted(rng, {"none": 2, "preset": 2, "int": 3, "paths": 2, "dynamic": 1})
    if tree == "preset":
        kw["tree"] = rng.choice(["chain", "small", "medium", "large", "xlarge"])
    elif tree == "int":
        kw["tree"] = rng.randint(1, 16)
    elif tree == "paths":
        kw["tree"] = _draw_tree_paths(rng, heads["num_heads"] + (1 if rng.random() < 0.1 else 0))
    elif tree == "dynamic":
        kw["tree"] = _dynamic_tree(rng, max_depth=deepest, depth_none=True)
    if case.path == "medusa_lookup":
        _lookup_kwargs(rng, kw)


def _mtp_kwargs(rng: random.Random, case: Case, kw: dict[str, Any]) -> None:
    """`use_mtp=True`: chains, or trees (grown from a single MTP layer; with several, refused)."""
    kw["use_mtp"] = True
    if rng.random() < (0.5 if case.target.options.get("mtp_layers") == 1 else 0.05):
        kw["tree"] = rng.randint(1, 16) if rng.random() < 0.5 else _dynamic_tree(rng)
    if rng.random() < 0.5:
        kw["num_assistant_tokens_schedule"] = rng.choice(["constant", "adaptive"])
    if rng.random() < 0.03:  # refused: prompt lookup is a drafter of its own
        kw["prompt_lookup_num_tokens"] = rng.randint(1, 10)


def _draw_callbacks(seed: str, size: int, batch: int) -> dict[str, Any] | None:
    """A quarter of the cases get a stopping criterion (a token per row, in loop or tensor form; a budget per row; or
    one that counts its calls) and a recording streamer, drawn from their own generator (the rest of a case is as
    it was drawn without them)."""
    rng = random.Random(f"fuzz_models:callbacks:{seed}")
    if rng.random() >= 0.25:
        return None
    kind = rng.choice(["row_tokens", "row_tokens_tensor", "budgets", "counting"])
    values = [rng.randrange(size) for _ in range(batch)] if kind.startswith("row") else []
    if kind == "budgets":
        values = [rng.randint(1, 12) for _ in range(batch)]
    return {"kind": kind, "values": values, "stop_at": rng.randint(1, 12), "stream": rng.random() < 0.7}


class Callbacks:
    """A case's stopping criterion and streamer, built anew for each call; `calls` records both, in order."""

    def __init__(self, spec: dict[str, Any], prompt: int) -> None:
        self.spec, self.prompt = spec, prompt
        self.calls: list[Any] = []

    def criterion(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        kind, values = self.spec["kind"], self.spec["values"]
        self.calls.append(("criteria", tuple(input_ids.shape)))
        rows = input_ids.shape[0]
        if kind == "row_tokens":
            return torch.tensor([int(input_ids[i, -1]) == values[i % len(values)] for i in range(rows)])
        if kind == "row_tokens_tensor":
            return input_ids[:, -1] == torch.tensor(values).repeat(rows // len(values) + 1)[:rows]
        if kind == "budgets":
            budgets = torch.tensor(values).repeat(rows // len(values) + 1)[:rows]
            return input_ids.shape[1] - self.prompt >= budgets
        return torch.full((rows,), len(self.calls) >= self.spec["stop_at"], dtype=torch.bool)

    def put(self, value: torch.Tensor) -> None:
        self.calls.append(("put", value.tolist()))

    def end(self) -> None:
        self.calls.append("end")

    def kwargs(self) -> dict[str, Any]:
        criteria = transformers.StoppingCriteriaList([_Criterion(self.criterion)])
        return {"stopping_criteria": criteria, **({"streamer": self} if self.spec["stream"] else {})}


class _Criterion(transformers.StoppingCriteria):
    def __init__(self, call: Any) -> None:
        self.call = call

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return self.call(input_ids, scores)


def draw_case(path: str, seed: str) -> Case:
    """One random case of `path`, a function of `seed` alone."""
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; one of {PATHS}")
    rng = random.Random(f"fuzz_models:{seed}")
    size = rng.randint(64, 300)
    specials = _specials(rng, size)
    rows = size if rng.random() < 0.6 else size + rng.randint(1, 40)
    target = draw_model_spec(rng, rows, specials, mtp=path == "mtp")
    if rng.random() < 0.08:
        target.dtype = "bfloat16"
    limit = learned_limit(target)
    repetitive = rng.random() < (0.7 if "lookup" in path or path == "hybrid" else 0.3)
    ids, mask, width = _draw_inputs(rng, size, rows, specials, limit, repetitive)
    gen: dict[str, Any] = {"do_sample": False}
    # Lengths: up to 40 new tokens, or exactly to / one past a limit the text may cross.
    edges = [e - width for e in [*rope_limits(target), *([limit] if limit else [])] if e - width >= 1]
    new = rng.randint(1, 40) if rng.random() < 0.95 else rng.randint(40, 96)
    if edges and rng.random() < 0.4:
        new = max(1, min(60, rng.choice(edges) + rng.choice([-1, 0, 0, 1, 2])))
    if rng.random() < 0.12:
        gen["max_length"] = width + new
    else:
        gen["max_new_tokens"] = new
    if rng.random() < 0.1:
        gen["min_new_tokens"] = rng.randint(0, new)
    eos_mode = _weighted(rng, {"given": 5, "from_output": 4, "list_from_output": 2})
    if eos_mode == "given" and rng.random() < 0.3:
        gen["eos_token_id"] = rng.choice([None, rng.randrange(size), [rng.randrange(size), rng.randrange(size)]])
    if rng.random() < 0.1:
        gen["pad_token_id"] = rng.choice([specials[1], rng.randrange(size)])
    if rng.random() < 0.1:
        gen["return_dict_in_generate"] = True
    case = Case(
        callbacks=_draw_callbacks(seed, size, len(ids)),
        path=path,
        seed=seed,
        tokenizer_size=size,
        target=target,
        input_ids=ids,
        attention_mask=mask,
        gen=gen,
        eos_mode=eos_mode,
        eos_pick=rng.randint(0, 10**6),
    )
    case.costs = list(rng.choice([(0.0, 0.0), (0.1, 0.01), (0.3, 0.05), (0.5, 0.1), (3.0, 1.0)]))
    kw = case.path_kwargs
    if path in ("assistant", "assistant_tree", "hybrid"):
        _draw_draft(rng, case, specials)
        if path == "assistant_tree":
            kw["tree"] = rng.randint(1, 24) if rng.random() < 0.5 else _dynamic_tree(rng)
        else:
            _chain_kwargs(rng, kw)
        _draft_vocabulary(rng, case, kw)
        if path == "hybrid":
            _lookup_kwargs(rng, kw, schedule=False)
    elif path == "lookup":
        _lookup_kwargs(rng, kw)
    elif path == "other_tokenizer":  # a draft of another vocabulary, drafting through text
        rows = rng.randint(16, 320)
        spec = draw_model_spec(rng, rows, _specials(rng, rows), draft=True)
        case.draft = {"kind": "model", "spec": asdict(spec)}
        case.tokenizers = True
        case.draft_vocab = {"seed": rng.randint(0, 10**6), "size": rows, "shared": rng.choice([0.0, 0.3, 0.9, 1.0])}
        if rng.random() < 0.1:
            kw["tree"] = rng.randint(1, 8)  # refused: a draft of another tokenizer drafts chains
        else:
            _chain_kwargs(rng, kw)
    elif path == "early_exit":  # the target's first layers draft (one layer of one: refused)
        kw["assistant_early_exit"] = rng.randint(1, max(1, target.layers - 1))
        if rng.random() < 0.3:
            kw["tree"] = rng.randint(1, 16) if rng.random() < 0.5 else _dynamic_tree(rng)
        else:
            _chain_kwargs(rng, kw)
        if rng.random() < 0.3:
            _lookup_kwargs(rng, kw, schedule=False)
    elif path == "mtp":
        _mtp_kwargs(rng, case, kw)
    else:
        _draw_heads(rng, case)
    if rng.random() < 0.15:  # the speculative call only: plain decoding keeps its dynamic cache as the reference
        kw["cache_implementation"] = "static"
    if path == "assistant_tree" and rng.random() < 0.3:  # drawn last: earlier draws stay what they were
        _lookup_kwargs(rng, kw, schedule=False)
    return case


# ---------------------------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Transformers' warnings about the drawn settings are not what is tested."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers_logging.set_verbosity(verbosity)


def _special_names(spec: ModelSpec) -> dict[int | None, str]:
    names = {spec.bos: "<s>", spec.eos: "</s>"}
    if spec.pad is not None and spec.pad not in names:
        names[spec.pad] = "<pad>"
    return names


def tokenizer(case: Case) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the case's size whose special tokens are the target's ids (a fresh object)."""
    names = _special_names(case.target)
    return _word_level([names.get(i, f"t{i}") for i in range(case.tokenizer_size)], case.target, names, case)


def draft_tokenizer(case: Case) -> PreTrainedTokenizerFast:
    """The draft's word-level tokenizer of another vocabulary: a `shared` part of the target's words at other
    ids, words of its own for the rest, the draft's special ids."""
    assert case.draft_vocab is not None
    spec = ModelSpec(**case.draft["spec"])  # type: ignore[index]
    rng = random.Random(case.draft_vocab["seed"])
    names = _special_names(spec)
    own = [i for i in range(case.draft_vocab["size"]) if i not in names]
    words = [f"t{i}" for i in range(case.tokenizer_size) if i not in _special_names(case.target)]
    shared = rng.sample(words, min(len(words), len(own), round(case.draft_vocab["shared"] * len(own))))
    rng.shuffle(own)
    chosen = dict(zip(own, shared + [f"u{j}" for j in range(len(own) - len(shared))], strict=True))
    return _word_level([names.get(i, chosen.get(i, "")) for i in range(spec.rows)], spec, names, case)


def _word_level(
    tokens: list[str], spec: ModelSpec, names: dict[int | None, str], case: Case
) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=tokens[-1]))
    if case.draft_vocab is not None:  # text goes through both tokenizers: words split on spaces
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials: dict[str, str] = {}
    if spec.bos is not None:
        specials["bos_token"] = names[spec.bos]
    if spec.eos is not None:
        specials["eos_token"] = names[spec.eos]
    if spec.pad is not None:
        specials["pad_token"] = names[spec.pad]
    with quiet():
        return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=tokens[-1], **specials)


def _copy_overlap(source: PreTrainedModel, dest: PreTrainedModel) -> None:
    """Copy `source`'s weights into `dest`, tensor by tensor, over the shapes they share (a shorter position
    table keeps the first rows)."""
    theirs = source.state_dict()
    with torch.no_grad():
        for name, tensor in dest.state_dict().items():
            if name in theirs:
                other = theirs[name]
                region = tuple(slice(0, min(a, b)) for a, b in zip(tensor.shape, other.shape, strict=True))
                tensor[region].copy_(other[region])


def build_draft(case: Case, target: PreTrainedModel) -> Any:
    """The case's draft (built after plain generate() ran on `target`)."""
    draft = case.draft
    assert draft is not None
    if draft["kind"] == "model":
        return build_model(ModelSpec(**draft["spec"]))
    if draft["kind"] == "no_lm_head":
        torch.manual_seed(0)
        with quiet():
            return transformers.AutoModel.from_config(
                make_config(case.target), attn_implementation=case.target.attn
            ).eval()
    if draft["kind"] == "target":
        return target
    # A twin: the target's weights plus noise, maybe with a shorter (or longer) position limit.
    spec = copy.deepcopy(case.target)
    if draft["positions"] is not None:
        spec.positions = draft["positions"]
    twin = build_model(spec).to(target.dtype)
    _copy_overlap(target, twin)
    generator = torch.Generator().manual_seed(draft["seed"])
    if draft["noise"]:
        with torch.no_grad():
            for parameter in twin.parameters():
                scale = draft["noise"] * parameter.abs().float().mean().clamp_min(1e-3)
                noise = torch.randn(parameter.shape, generator=generator) * scale
                parameter.add_(noise.to(parameter.dtype))
    return twin.to(getattr(torch, draft["dtype"]))


def build_heads(case: Case, base: PreTrainedModel) -> MedusaForCausalLM:
    h = case.heads
    assert h is not None
    config = MedusaConfig(
        num_heads=h["num_heads"],
        num_layers=h["num_layers"],
        head_type=h["head_type"],
        share_lm_head=h["share_lm_head"],
        feature_layers=h.get("feature_layers"),
    )
    token_ids = None if h["token_ids"] is None else torch.tensor(h["token_ids"])
    torch.manual_seed(h["seed"])
    model = MedusaForCausalLM.from_base(base, config, token_ids=token_ids)
    if h["noise"]:
        generator = torch.Generator().manual_seed(h["seed"] + 1)
        with torch.no_grad():
            for parameter in model.heads.parameters():
                scale = h["noise"] * parameter.abs().float().mean().clamp_min(0.05)
                parameter.add_((torch.randn(parameter.shape, generator=generator) * scale).to(parameter.dtype))
    return model.eval()


def inputs(case: Case) -> dict[str, torch.Tensor]:
    batch = {"input_ids": torch.tensor(case.input_ids, dtype=torch.long)}
    if case.attention_mask is not None:
        batch["attention_mask"] = torch.tensor(case.attention_mask, dtype=torch.long)
    return batch


@dataclass
class Result:
    kind: str  # "same" | "refused" | "both refused" | "DIFFERENT" | "CRASH" | "bf16 differs"
    outcome: str  # the record's outcome string
    failure: bool
    origin: str = ""  # where a refusal or crash was raised: file:line of the innermost frame
    gen: dict[str, Any] = field(default_factory=dict)  # the generation arguments used (EOS resolved)
    seconds: float = 0.0


def _origin(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    parts = Path(frame.filename).parts
    for anchor in ("hf_specdec", "transformers", "torch", "tokenizers"):
        if anchor in parts:
            start = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[start:]) + f":{frame.lineno}"
    return f"{Path(frame.filename).name}:{frame.lineno}"


def _message(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _call(model: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
    try:
        with torch.no_grad(), quiet():
            out = model.generate(**kwargs)
        return (out.sequences if hasattr(out, "sequences") else out), None
    except Exception as error:
        return None, error


def _resolve_eos(case: Case, model: Any, batch: dict[str, torch.Tensor], gen: dict[str, Any]) -> dict[str, Any]:
    """For the from_output modes: run plain greedy without EOS, and take a token it generated as the EOS id."""
    if case.eos_mode == "given":
        return gen
    out, error = _call(model, **batch, **{**gen, "eos_token_id": None})
    if error is not None or out is None:
        return gen
    generated = out[:, batch["input_ids"].shape[1] :].reshape(-1).tolist()
    if not generated:
        return gen
    pick = random.Random(case.eos_pick)
    token = pick.choice(generated)
    if case.eos_mode == "list_from_output":
        return {**gen, "eos_token_id": [token, pick.choice(generated), pick.randrange(case.tokenizer_size)]}
    return {**gen, "eos_token_id": token}


def _difference(ours: torch.Tensor, plain: torch.Tensor, prompt: int) -> tuple[str, int, int] | None:
    """(text, row, column) of the first difference, or None when equal."""
    if ours.shape == plain.shape and torch.equal(ours, plain):
        return None
    if ours.shape[0] != plain.shape[0]:
        return f"shapes {tuple(ours.shape)} (ours) vs {tuple(plain.shape)} (plain)", -1, -1
    width = min(ours.shape[1], plain.shape[1])
    unequal = (ours[:, :width] != plain[:, :width]).nonzero()
    if len(unequal) == 0:
        r = 0
        c = width
        text = f"lengths {ours.shape[1] - prompt} (ours) vs {plain.shape[1] - prompt} (plain) new tokens"
        return text, r, c
    r, c = (int(x) for x in unequal[0])
    text = (
        f"row {r}, new token {c - prompt}: ours {ours[r, c : c + 4].tolist()} vs plain {plain[r, c : c + 4].tolist()}"
        f" (lengths {ours.shape[1] - prompt} vs {plain.shape[1] - prompt})"
    )
    return text, r, c


def _plain_gap(model: Any, batch: dict[str, torch.Tensor], gen: dict[str, Any], row: int, column: int) -> str:
    """How far plain's best score was ahead of the second best where the outputs part (a float tie or not)."""
    step = column - batch["input_ids"].shape[1]
    if row < 0 or step < 0:
        return ""
    try:
        with torch.no_grad(), quiet():
            out = model.generate(**batch, **{**gen, "return_dict_in_generate": True, "output_scores": True})
        scores = out.scores[step][row].float()
        top = scores.topk(2).values
        return f"; plain's top-2 score gap there: {float(top[0] - top[1]):.3g}"
    except Exception as error:
        return f"; (gap unknown: {type(error).__name__})"


def _refusal_ok(error: BaseException) -> bool:
    return isinstance(error, ValueError | TypeError) and bool(str(error).strip())


def _crash(error: BaseException, where: str) -> str:
    text = "".join(traceback.format_exception(error))
    message = str(error).strip() or "<empty message>"
    return f"CRASH: {type(error).__name__}: {message} ({where})\n{text}"


def speculative_kwargs(case: Case, draft: Any = None) -> dict[str, Any]:
    """The path's own arguments to generate(), `draft` (from `build_draft`) as `assistant=`."""
    kw = {name: _decode_tree(value) for name, value in case.path_kwargs.items()}
    kw["speculative_costs"] = SpeculativeCosts(*case.costs)
    if case.draft is not None:
        kw["assistant"] = draft
    if case.tokenizers:
        kw["tokenizer"] = tokenizer(case)
        kw["assistant_tokenizer"] = tokenizer(case) if case.draft_vocab is None else draft_tokenizer(case)
    return kw


def run_case(case: Case) -> Result:
    """Plain greedy generate() and the case's path on the same model and inputs, compared."""
    start = time.perf_counter()
    result = _run(case)
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _run(case: Case) -> Result:
    try:
        target = build_model(case.target)
    except Exception as error:
        return Result("invalid", f"invalid: the target does not build: {_message(error)}", False)
    batch = inputs(case)
    gen = _resolve_eos(case, target, batch, dict(case.gen))
    prompt = batch["input_ids"].shape[1]
    plain_callbacks = Callbacks(case.callbacks, prompt) if case.callbacks else None
    callbacks = Callbacks(case.callbacks, prompt) if case.callbacks else None
    plain_extra = plain_callbacks.kwargs() if plain_callbacks else {}
    plain, plain_error = _call(target, **{k: v.clone() for k, v in batch.items()}, **gen, **plain_extra)
    lenient = case.target.dtype != "float32"
    draft = None
    if case.draft is not None:
        try:
            draft = build_draft(case, target)
            if case.draft["kind"] in ("model", "twin"):
                with torch.no_grad(), quiet():
                    draft(input_ids=torch.tensor([[3, 4]]))
        except Exception as error:
            return Result("invalid", f"invalid: the draft does not run: {_message(error)}", False, "", gen)
    try:
        runner = build_heads(case, target) if case.heads is not None else hf_specdec.speculative(target)
        extra = speculative_kwargs(case, draft)
        if callbacks is not None:
            extra.update(callbacks.kwargs())
        ours, error = _call(runner, **{k: v.clone() for k, v in batch.items()}, **gen, **extra)
    except Exception as setup_error:
        ours, error = None, setup_error
    if plain_error is not None:
        if error is None:
            text = f"DIFFERENT: plain generate() raised {_message(plain_error)[:300]}; {case.path} returned an output"
            return Result("DIFFERENT", text, True, _origin(plain_error), gen)
        if _refusal_ok(error):
            text = f"both refused: plain {_message(plain_error)[:200]} | ours {_message(error)}"
            return Result("both refused", text, False, _origin(error), gen)
        return Result("CRASH", _crash(error, f"plain raised {_message(plain_error)[:200]}"), True, _origin(error), gen)
    if error is not None:
        if _refusal_ok(error):
            if is_documented(str(error), case.path):
                return Result("refused", f"refused: {_message(error)}", False, _origin(error), gen)
            text = f"UNDOCUMENTED refusal: {_message(error)}"  # one docs/refusals.md does not list for the path
            return Result("UNDOCUMENTED", text, True, _origin(error), gen)
        return Result("CRASH", _crash(error, "plain generate() returned an output"), True, _origin(error), gen)
    assert plain is not None and ours is not None
    difference = _difference(ours, plain, batch["input_ids"].shape[1])
    if difference is None and callbacks is not None and plain_callbacks is not None and not lenient:
        ours_calls, plain_calls = callbacks.calls, plain_callbacks.calls
        if ours_calls != plain_calls:
            pairs = zip(ours_calls, plain_calls, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours_calls), len(plain_calls)))
            text = f"DIFFERENT: the criterion's and streamer's calls part at call {at} ({case.callbacks['kind']})"
            return Result("DIFFERENT", text, True, "", gen)
    if difference is None:
        return Result("same", "same", False, "", gen)
    text, row, column = difference
    if lenient:
        return Result("bf16 differs", f"bf16 differs (not checked): {text}", False, "", gen)
    gap = _plain_gap(target, batch, gen, row, column)
    return Result("DIFFERENT", f"DIFFERENT: {text}{gap}", True, "", gen)


# ---------------------------------------------------------------------------------------------------------
# Records and reproducers
# ---------------------------------------------------------------------------------------------------------


def describe(case: Case) -> str:
    """One line: the case's most telling features."""
    t = case.target
    rope = (t.rope or {}).get("rope_type", "none") if ARCHS[t.arch].rope else "-"
    parts = [
        f"{t.arch} L{t.layers} h{t.hidden} rope={rope} pos={t.positions} win={t.window}"
        + (f" mtp={t.options['mtp_layers']}" if t.options.get("mtp_layers") else ""),
        f"rows={t.rows}/{case.tokenizer_size}",
        f"{t.dtype} {t.attn} tied={t.tied} bos/eos/pad={t.bos}/{t.eos}/{t.pad}",
        f"batch={len(case.input_ids)}x{len(case.input_ids[0])} mask={'yes' if case.attention_mask else 'no'}",
        f"gen={case.gen} eos_mode={case.eos_mode}",
    ]
    if case.draft:
        d = case.draft
        if d["kind"] == "model":
            s = d["spec"]
            parts.append(f"draft={s['arch']} pos={s['positions']} rows={s['rows']} {s['dtype']}")
        else:
            parts.append(f"draft={d}")
    if case.heads:
        parts.append(f"heads={ {k: v for k, v in case.heads.items() if k != 'token_ids'} }")
    kwargs = {k: (f"<{len(v)} ids>" if k == "assistant_vocab" else v) for k, v in case.path_kwargs.items()}
    parts.append(f"kwargs={kwargs} costs={case.costs}")
    return " | ".join(parts)


def record(case: Case, result: Result) -> dict[str, Any]:
    """One JSON line of a run."""
    return {
        "path": case.path,
        "seed": case.seed,
        "description": describe(case),
        "kind": result.kind,
        "failure": result.failure,
        "outcome": result.outcome,
        "origin": result.origin,
        "gen": result.gen,
        "seconds": result.seconds,
        "case": case.to_json(),
    }


def reproducer(case: Case) -> str:
    """A Python snippet that reruns the case from its JSON (run from the repository root)."""
    data = json.dumps(case.to_json())
    return (
        f"from tests.fuzz_models import Case, run_case\ncase = Case.from_json({data})\nprint(run_case(case).outcome)\n"
    )
