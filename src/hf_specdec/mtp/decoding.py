"""Decoding with the target's own multi-token-prediction layers (`generate(use_mtp=True)`): the library's one
decoding loop (`hf_specdec.generation.loop.decode`) with the MTP layers as its drafter, at any batch size: a
chain of one token per MTP layer (`MtpDrafter`), or with `tree=` a tree grown by the first MTP layer applied at
every depth (`MtpFeatureHead` driven as an EAGLE head, models with one MTP layer)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.modeling_layers import MtpModel

from hf_specdec.generation.decisions import CostModel, SpeculativeCosts, remembered_costs, weight_count
from hf_specdec.generation.drafter import Drafter, DrafterFactory, DraftingContext
from hf_specdec.generation.loop import decode
from hf_specdec.generation.outputs import SpeculativeDecoderOnlyOutput
from hf_specdec.medusa.eagle_drafter import EagleDrafter
from hf_specdec.mtp.chain import MtpDrafter
from hf_specdec.mtp.layers import mtp_layers
from hf_specdec.mtp.tree import MtpFeatureHead, mtp_tree
from hf_specdec.trees.dynamic import DynamicTree


def mtp_drafter_for(
    model: PreTrainedModel,
    mtp: MtpModel | None = None,
    tree: DynamicTree | int | None = None,
    adaptive: bool = True,
) -> DrafterFactory:
    """The drafter factory for `model`'s MTP layers (`mtp`, else the ones attached to it or loaded from its
    checkpoint: `layers.mtp_layers`): chains, or trees with `tree=` (grown as far as they pay when
    `adaptive`, else whole). Refuses a model without MTP layers, and trees on a model with several."""
    layers = mtp_layers(model) if mtp is None else mtp
    if tree is None:
        return functools.partial(MtpDrafter, mtp=layers)
    if len(layers.layers) != 1:
        raise ValueError(
            f"{type(model).__name__} has {len(layers.layers)} MTP layers, which draft a chain of as many tokens "
            "together; `tree=` grows trees from a single MTP layer. Drop `tree=`."
        )

    def make_drafter(context: DraftingContext) -> Drafter:
        head = MtpFeatureHead(layers, context.vocab_size)
        return EagleDrafter(context, heads=head, tree=mtp_tree(tree), adaptive=adaptive)

    return make_drafter


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
    tree: DynamicTree | int | None = None,
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
            (`layers.attach_mtp`), else loaded once from its checkpoint.
        tree (`DynamicTree` or `int`, *optional*): grow a tree per row and step from the (single) MTP layer
            instead of a chain (a number of nodes: the default shape, `tree.mtp_tree`).
        costs (`SpeculativeCosts`, *optional*): fixed costs instead of measured ones.
        adaptive (`bool`): take plain steps where drafting is not expected to pay, and grow trees only as far as
            they pay; otherwise draft (the whole tree) at every step.
        streamer, generator, model_kwargs: as for [`decode`].
    """
    layers = mtp_layers(model) if mtp is None else mtp
    return decode(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        make_drafter=mtp_drafter_for(model, layers, tree, adaptive),
        costs=remembered_costs(
            model, layers, CostModel(mtp_parameter_share(layers, model), costs), "chain" if tree is None else "tree"
        ),
        path="`use_mtp=True`",
        plain_steps=adaptive,
        streamer=streamer,
        generator=generator,
        **model_kwargs,
    )
