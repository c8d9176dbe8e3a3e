"""Decoding with the target's own multi-token-prediction layers (`generate(use_mtp=True)`): the library's one
decoding loop (`hf_specdec.generation.loop.decode`) with `MtpDrafter` as its drafter, at any batch size."""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.modeling_layers import MtpModel

from hf_specdec.drafters.base import DrafterFactory
from hf_specdec.drafters.mtp import MtpDrafter
from hf_specdec.drafters.mtp_layers import mtp_layers
from hf_specdec.generation.decisions import CostModel, SpeculativeCosts, weight_count
from hf_specdec.generation.loop import decode
from hf_specdec.generation.outputs import SpeculativeDecoderOnlyOutput


def mtp_drafter_for(model: PreTrainedModel, mtp: MtpModel | None = None) -> DrafterFactory:
    """The drafter factory for `model`'s MTP layers (`mtp`, else the ones attached to it or loaded from its
    checkpoint: `mtp_layers.mtp_layers`); refuses a model without MTP layers."""
    layers = mtp_layers(model) if mtp is None else mtp
    return functools.partial(MtpDrafter, mtp=layers)


def mtp_parameter_share(mtp: MtpModel, model: PreTrainedModel) -> float:
    """A first guess of one MTP forward's cost, in target forwards: one layer's weights and the lm_head it
    projects through, relative to the target's weights."""
    per_layer = sum(weight_count(layer) for layer in mtp.layers) / max(len(mtp.layers), 1)
    return (per_layer + mtp.shared_head.weight.numel()) / max(weight_count(model), 1)


@torch.no_grad()
def mtp_decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    mtp: MtpModel | None = None,
    costs: SpeculativeCosts | None = None,
    adaptive: bool = True,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """Generate with chains drafted by the target's own MTP layers, keeping its greedy tokens or its sampling
    distribution exactly.

    Args:
        model (`PreTrainedModel`): the target, whose config sets `num_mtp_layers`.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        mtp (`MtpModel`, *optional*): the MTP layers; by default the ones attached to the model
            (`mtp_layers.attach_mtp`), else loaded once from its checkpoint.
        costs (`SpeculativeCosts`, *optional*): fixed costs instead of measured ones.
        adaptive (`bool`): take plain steps where drafting is not expected to pay; otherwise draft every step.
        streamer, generator, model_kwargs: as for [`decode`].
    """
    layers = mtp_layers(model) if mtp is None else mtp
    return decode(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        make_drafter=mtp_drafter_for(model, layers),
        costs=CostModel(mtp_parameter_share(layers, model), costs),
        path="`use_mtp=True`",
        plain_steps=adaptive,
        streamer=streamer,
        generator=generator,
        **model_kwargs,
    )
