"""Decoding with a draft model, prompt lookup, or both: the drafter these paths use, handed to the loop.

`speculative_decode` is what `generate(assistant=... | prompt_lookup_num_tokens=...)` runs (see
`hf_specdec.api.mixin`): it picks the drafter (a draft model's chain or tree, prompt lookup, or the two
together) and runs the one decoding loop, `hf_specdec.generation.loop.decode`, with it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.drafters.draft_model import DraftModelDrafter
from hf_specdec.drafters.draft_tree import DraftTreeDrafter
from hf_specdec.drafters.hybrid import HybridDrafter
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.drafters.recurrent_tree import RecurrentDraftTreeDrafter
from hf_specdec.drafters.text_alignment import Tokenizers
from hf_specdec.drafters.translated import TranslatedDrafter
from hf_specdec.generation.decisions import CostModel, SpeculativeCosts, parameter_share, remembered_costs
from hf_specdec.generation.drafter import Drafter, DraftingContext
from hf_specdec.generation.loop import decode
from hf_specdec.generation.outputs import SpeculativeDecoderOnlyOutput
from hf_specdec.generation.recurrent import has_recurrent_layers
from hf_specdec.generation.validation import check_other_tokenizer_settings
from hf_specdec.trees.dynamic import DynamicTree


@torch.no_grad()
def speculative_decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    assistant: PreTrainedModel | None = None,
    prompt_lookup: PromptLookupDrafter | None = None,
    draft_length: DraftLengthPolicy | None = None,
    costs: SpeculativeCosts | None = None,
    assistant_vocab: torch.Tensor | None = None,
    tree: DynamicTree | None = None,
    tokenizers: Tokenizers | None = None,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """Generate with chains drafted by a draft model, by prompt lookup, or by both (each step the one expected
    to pay more, `HybridDrafter`), or with trees grown by a draft model (`tree`), keeping the target's greedy
    tokens or its sampling distribution exactly.

    Args:
        model (`PreTrainedModel`): the target.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        assistant (`PreTrainedModel`, *optional*): the draft model.
        prompt_lookup (`PromptLookupDrafter`, *optional*): draft by prompt lookup.
        draft_length (`DraftLengthPolicy`, *optional*): how many tokens the draft model drafts per step (adaptive
            by default).
        costs (`SpeculativeCosts`, *optional*): fixed costs for the adaptive decisions instead of measured ones.
        assistant_vocab (`torch.LongTensor`, *optional*): the only tokens the draft may propose.
        tree (`DynamicTree`, *optional*): the draft model grows this tree per row and step (`DraftTreeDrafter`)
            instead of a chain; with prompt lookup, each row's looked-up continuation is grafted onto it.
        tokenizers (`Tokenizers`, *optional*): the target's and the draft's tokenizers, when their vocabularies
            differ: the draft then drafts through text (`TranslatedDrafter`, chains only).
        streamer, generator, model_kwargs: as for [`decode`].
    """
    if assistant is None and prompt_lookup is None:
        raise ValueError("Pass a source of drafts: `assistant=` (a draft model), `prompt_lookup=`, or both.")
    if tree is not None and assistant is None:
        raise ValueError("A draft tree is grown by a draft model: pass `assistant=` too.")
    if tokenizers is not None:
        check_other_tokenizer_settings(tree, assistant_vocab, prompt_lookup)
    schedule = DraftLengthPolicy() if draft_length is None else draft_length
    make_drafter = functools.partial(
        _drafter,
        assistant=assistant,
        prompt_lookup=prompt_lookup,
        assistant_vocab=assistant_vocab,
        tree=tree,
        tokenizers=tokenizers,
        schedule=schedule,
    )
    path = "`assistant=`" if assistant is not None else "prompt lookup"
    # Plain steps where drafting does not pay belong to the adaptive schedule; "constant" and "heuristic" draft
    # as they say at every step.
    adaptive = schedule.adaptive if assistant is not None else bool(prompt_lookup and prompt_lookup.adaptive)
    if assistant is None:  # no draft forward to pay for
        cost_model = remembered_costs(model, "prompt lookup", CostModel.verification_only(costs))
    else:
        how = "tree" if tree is not None else "other tokenizer" if tokenizers is not None else "chain"
        cost_model = remembered_costs(model, assistant, CostModel(parameter_share(assistant, model), costs), how)
    return decode(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        make_drafter=make_drafter,
        costs=cost_model,
        path=path,
        plain_steps=adaptive,
        streamer=streamer,
        generator=generator,
        **model_kwargs,
    )


def _drafter(
    context: DraftingContext,
    assistant: PreTrainedModel | None,
    prompt_lookup: PromptLookupDrafter | None,
    assistant_vocab: torch.Tensor | None,
    tree: DynamicTree | None,
    tokenizers: Tokenizers | None,
    schedule: DraftLengthPolicy,
) -> Drafter:
    if assistant is None:
        assert prompt_lookup is not None
        return prompt_lookup
    if tokenizers is not None:
        return TranslatedDrafter(assistant, tokenizers, context, schedule)
    common = (assistant, context.vocab_size, context.processors, context.do_sample, context.generator, assistant_vocab)
    settings = {"schedule": schedule, "reads": context.reads, "generation_config": context.generation_config}
    if tree is not None:
        grows = RecurrentDraftTreeDrafter if has_recurrent_layers(assistant) else DraftTreeDrafter
        return grows(*common, tree=tree, prompt_lookup=prompt_lookup, **settings)
    drafter = DraftModelDrafter(*common, **settings)
    return drafter if prompt_lookup is None else HybridDrafter(drafter, prompt_lookup)
