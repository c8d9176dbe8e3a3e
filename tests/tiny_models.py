"""Tiny random causal LMs of several architectures, built from configs (no downloads)."""

from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import hf_specdec

VOCAB = 96
EOS = 3
PAD = 0
BOS = 1


def _llama_like(config_cls, model_cls, **extra):
    def build(num_layers: int = 2) -> PreTrainedModel:
        config = config_cls(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            eos_token_id=EOS,
            pad_token_id=PAD,
            bos_token_id=BOS,
            **extra,
        )
        return model_cls(config)

    return build


def _gpt2(num_layers: int = 2) -> PreTrainedModel:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=num_layers,
        n_head=4,
        n_positions=512,
        tie_word_embeddings=False,  # so that sharpening the output layer leaves the input embeddings alone
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=BOS,
    )
    return GPT2LMHeadModel(config)


BUILDERS = {
    "llama": _llama_like(LlamaConfig, LlamaForCausalLM),
    "qwen2": _llama_like(Qwen2Config, Qwen2ForCausalLM),
    # A window shorter than the generations, so the sliding-window mask is really exercised.
    "mistral": _llama_like(MistralConfig, MistralForCausalLM, sliding_window=12),
    "gpt2": _gpt2,
}


def tiny_model(arch: str, seed: int, num_layers: int = 2, sharpen: float = 1.0) -> PreTrainedModel:
    """A seeded random model in float32, eval mode. `sharpen` scales the output layer so that
    distributions are peakier and generations less uniform."""
    torch.manual_seed(seed)
    model = BUILDERS[arch](num_layers).eval()
    if sharpen != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)
    return model


def tiny_target(arch: str, seed: int = 0, sharpen: float = 4.0) -> PreTrainedModel:
    """A tiny target with speculative `generate()`."""
    return hf_specdec.speculative(tiny_model(arch, seed, sharpen=sharpen))


def ragged_batch(batch: int, seed: int = 0, prompt: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of different lengths: row b has `prompt - 3*b` real tokens (at least 1)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (batch, prompt), generator=generator)
    mask = torch.ones_like(ids)
    for b in range(batch):
        mask[b, : min(3 * b, prompt - 1)] = 0
    ids[mask == 0] = PAD
    return ids, mask
