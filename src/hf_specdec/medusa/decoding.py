"""Decoding with draft heads: the library's one decoding loop (`hf_specdec.generation.loop.decode`) with the
heads as its drafter (`MedusaDrafter`, or `EagleDrafter` for EAGLE heads): candidates from the heads (a static or
a dynamic tree, with prompt lookup's continuation grafted on when asked), one tree forward, the deepest node whose
path is right, its path committed.

Handed to transformers' `generate()` as its decoding method, so generation configs, processors, stopping
criteria and streamers work as in plain decoding.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.generation.decisions import CostModel, SpeculativeCosts, parameter_share, remembered_costs
from hf_specdec.generation.drafter import DrafterFactory
from hf_specdec.generation.loop import ACCEPTANCE, decode
from hf_specdec.generation.outputs import SpeculativeDecoderOnlyOutput
from hf_specdec.medusa.drafter import MedusaDrafter
from hf_specdec.medusa.eagle_drafter import EagleDrafter
from hf_specdec.medusa.heads import DraftHeads
from hf_specdec.medusa.sequence_heads import SequenceHeads
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.static import DraftTree

__all__ = ["ACCEPTANCE", "medusa_decode"]


@torch.no_grad()
def medusa_decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    heads: DraftHeads,
    tree: DraftTree | DynamicTree,
    acceptance: str = "exact",
    typical_epsilon: float = 0.09,
    typical_delta: float = 0.3,
    prompt_lookup: PromptLookupDrafter | None = None,
    costs: SpeculativeCosts | None = None,
    adaptive: bool = True,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """Generate with Medusa heads verifying a tree of candidates per step.

    Args:
        model (`PreTrainedModel`): the base model.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        heads (`DraftHeads`): the heads on the base's last hidden state (Medusa's, recurrent or EAGLE ones).
        tree (`DraftTree` or `DynamicTree`): which candidates to verify: the same tree at every step, or one
            grown per row and step from the heads' probabilities.
        acceptance (`str`): `"exact"` (greedy identity, or the target's exact distribution when sampling) or
            `"typical"` (Medusa's typical acceptance when sampling: faster, **lossy**).
        prompt_lookup (`PromptLookupDrafter`, *optional*): also graft each row's prompt-lookup continuation onto
            its tree, as long as the measured acceptance of its matches pays for verifying it.
        costs (`SpeculativeCosts`, *optional*): fixed costs instead of measured ones (see
            `hf_specdec.generation.decisions`).
        adaptive (`bool`): grow and verify dynamic trees as far as they pay, graft as much of a lookup match as pays
            and take plain steps where drafting does not pay; otherwise the whole tree and match at every step.
        streamer, generator, model_kwargs: as for [`hf_specdec.generation.loop.decode`].

    Returns:
        `torch.LongTensor` `(batch, prompt + new)`, or a `SpeculativeDecoderOnlyOutput`.
    """
    if isinstance(tree, DynamicTree) and tree.depth is None:
        raise ValueError("medusa_decode needs a DynamicTree with a depth (generate() sets the heads' own).")
    # The loop measures what verifying one more token costs: it decides how far a match is worth grafting, how
    # far a dynamic tree grows and how many of its nodes are verified, and whether a tree pays for itself at all.
    make_drafter: DrafterFactory
    if isinstance(heads, SequenceHeads):
        if not isinstance(tree, DynamicTree):
            raise ValueError("EAGLE heads grow a tree per row and step: pass a DynamicTree.")
        # A head forward per depth has a cost (c, measured): trees stop growing where a depth does not pay.
        how = "chain" if tree.top_k == 1 else "tree"
        cost_model = remembered_costs(model, heads, CostModel(_parameter_share(heads, model), costs), how)
        make_drafter = functools.partial(
            EagleDrafter, heads=heads, tree=tree, prompt_lookup=prompt_lookup, adaptive=adaptive
        )
    else:
        cost_model = remembered_costs(model, heads, CostModel.verification_only(costs))
        make_drafter = functools.partial(
            MedusaDrafter, heads=heads, tree=tree, prompt_lookup=prompt_lookup, adaptive=adaptive
        )
    return decode(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        make_drafter=make_drafter,
        costs=cost_model,
        path="`medusa=True`",
        plain_steps=adaptive,
        acceptance=acceptance,
        typical_epsilon=typical_epsilon,
        typical_delta=typical_delta,
        streamer=streamer,
        generator=generator,
        **model_kwargs,
    )


def _parameter_share(heads: DraftHeads, model: PreTrainedModel) -> float:
    """The heads' size relative to the base's, the lm_head rows they project onto included: a first guess of a
    head forward's cost, in base forwards."""
    lm_head_rows = 0
    if heads.reads_base_lm_head:
        lm_head_rows = heads.head_vocab_size * model.get_output_embeddings().weight.shape[1]
    return parameter_share(heads, model, extra=lm_head_rows)
