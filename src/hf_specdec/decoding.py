"""The speculative decoding loop: draft, verify, accept, commit.

`speculative_decode` is handed to transformers' `generate()` as its decoding method, after `generate()` has
prepared the inputs, the generation config, the logits processors and the stopping criteria exactly as for
plain decoding. The drafts come from a draft model (`assistant=`) or from prompt lookup. Every row of the
batch runs its own acceptance; finished rows leave the batch.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.acceptance import greedy_accept, point_draft_sampling, speculative_sampling
from hf_specdec.draft_length import DraftLengthPolicy
from hf_specdec.drafter import DraftModelDrafter
from hf_specdec.drafting import Drafter
from hf_specdec.hybrid import HybridDrafter
from hf_specdec.inputs import check_prompts
from hf_specdec.kv_cache import CachedSequence
from hf_specdec.lookup import PromptLookupDrafter
from hf_specdec.masks import chain_structure
from hf_specdec.outputs import ScoreRecorder, SpeculativeDecoderOnlyOutput, SpeculativeStats
from hf_specdec.processing import RaggedLogitsProcessor, verification_scores
from hf_specdec.row_trees import RowTrees
from hf_specdec.sequences import TokenBuffer
from hf_specdec.validation import check_generation_config


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Logical positions `(batch, prompt)` of left-padded prompt tokens, as plain `generate()` computes them."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


def choose_token(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from processed scores `(batch, vocab)`: a sample, or the argmax."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)
    return scores.argmax(dim=-1)


def synchronize(device: torch.device) -> None:
    """Wait for the device, so that a wall-clock reading covers the work queued before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Rows:
    """What the loop tracks per active row besides tokens and caches."""

    next_position: torch.Tensor  # (A,) logical position of the first draft of the next step
    last_token: torch.Tensor  # (A,) committed, not yet fed to the target


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
    draft_length: DraftLengthPolicy,
    assistant_vocab: torch.Tensor | None = None,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """Generate with drafted tokens, keeping the target's greedy tokens or its sampling distribution exactly.

    Args:
        model (`PreTrainedModel`): the target.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        assistant (`PreTrainedModel`, *optional*): the draft model.
        prompt_lookup (`PromptLookupDrafter`, *optional*): draft by prompt lookup; with `assistant` too, each step
            drafts with whichever of the two is expected to pay more (`HybridDrafter`).
        draft_length (`DraftLengthPolicy`): how many tokens the draft model drafts per step; it also measures the
            costs every drafter's length rule uses.
        assistant_vocab (`torch.LongTensor`, *optional*): the only tokens the draft may propose.
        streamer (`BaseStreamer`, *optional*): receives each step's committed tokens (batch size 1).
        generator (`torch.Generator`, *optional*): randomness for sampling, for reproducible runs.
        model_kwargs: `attention_mask` `(batch, prompt)`, 0 on left padding (`None` when there is none);
            the cache and positions `generate()` prepared are ignored, anything else is refused.

    Returns:
        `torch.LongTensor` `(batch, prompt + new)` on the device of `input_ids`, or a
        `SpeculativeDecoderOnlyOutput` when `return_dict_in_generate=True`.
    """
    if assistant is None and prompt_lookup is None:
        raise ValueError("Pass a source of drafts: `assistant=` (a draft model), `prompt_lookup=`, or both.")
    check_generation_config(
        generation_config, per_token_scores=True, path="`assistant=`" if assistant is not None else "prompt lookup"
    )
    check_prompts(model, input_ids, model_kwargs.get("attention_mask"))
    attention_mask = model_kwargs.pop("attention_mask", None)
    reject_model_kwargs(model_kwargs)
    input_device, device = input_ids.device, model.device
    input_ids = input_ids.to(device=device, dtype=torch.long)  # plain generate() takes any integer ids
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    do_sample = bool(generation_config.do_sample)
    processors = RaggedLogitsProcessor(logits_processor)
    # Scratch after max_length: the k drafts of a step plus the token the target adds.
    longest = max(draft_length.max_tokens, prompt_lookup.num_tokens if prompt_lookup is not None else 0)
    buffer = TokenBuffer(input_ids, generation_config, stopping_criteria, scratch=longest + 1)
    stats = SpeculativeStats.zeros(input_ids.shape[0])
    recorder = ScoreRecorder(
        input_ids.shape[0], bool(generation_config.output_scores), bool(generation_config.output_logits)
    )

    # Prefill both models on the prompts; the target's last logits give the first token.
    valid, positions = attention_mask.bool(), prompt_positions(attention_mask)
    target = CachedSequence(model, input_ids.shape[0], device)
    prompt_structure = chain_structure(input_ids.shape[1], device)
    logits = target.forward(input_ids, valid, positions, prompt_structure, logits_to_keep=1).logits[:, -1:].float()
    scores = processors(buffer, buffer.active, buffer.active_lengths, logits)  # (B, 1, V)
    first = choose_token(scores[:, 0], do_sample, generator)  # (B,)
    drafter: Drafter
    if assistant is None:
        assert prompt_lookup is not None
        drafter = prompt_lookup
    else:
        drafter = DraftModelDrafter(assistant, logits.shape[-1], processors, do_sample, generator, assistant_vocab)
        if prompt_lookup is not None:
            drafter = HybridDrafter(drafter, prompt_lookup)
    drafter.prefill(input_ids, valid, positions)
    emitted, finished = buffer.commit(first[:, None], torch.ones_like(first), scores)
    recorder.record(buffer.active, emitted, scores, logits)
    stream(streamer, first[:, None], emitted)
    drafter.start(first)
    rows = _Rows(next_position=positions[:, -1] + 2, last_token=first)

    while True:
        keep = buffer.retire(finished)
        if keep.numel() == 0:
            break
        if keep.numel() < finished.numel():
            target.select_rows(keep)
            drafter.select_rows(keep)
            rows = _Rows(rows.next_position[keep], rows.last_token[keep])
        finished = _step(
            model,
            target,
            drafter,
            buffer,
            rows,
            processors,
            draft_length,
            stats,
            streamer,
            do_sample,
            generator,
            recorder,
        )

    stats.costs = draft_length.estimated_costs
    return finish(buffer, generation_config, stats, streamer, input_device, recorder)


def finish(
    buffer: TokenBuffer,
    generation_config: GenerationConfig,
    stats: SpeculativeStats,
    streamer: BaseStreamer | None,
    device: torch.device,
    recorder: ScoreRecorder | None = None,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """End the streamer and return `generate()`'s result: the padded sequences on `device`, with the
    speculative statistics when `return_dict_in_generate=True`."""
    if streamer is not None:
        streamer.end()
    pad = generation_config._pad_token_tensor
    sequences = buffer.sequences(int(pad) if pad is not None else 0).to(device)
    if generation_config.return_dict_in_generate:
        if recorder is not None:
            recorder.trim(buffer.lengths - buffer.prompt_length)
        scores = recorder.scores() if recorder is not None else None
        logits = recorder.logits() if recorder is not None else None
        return SpeculativeDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, speculative=stats)
    return sequences


def _step(
    model: PreTrainedModel,
    target: CachedSequence,
    drafter: Drafter,
    buffer: TokenBuffer,
    rows: _Rows,
    processors: RaggedLogitsProcessor,
    policy: DraftLengthPolicy,
    stats: SpeculativeStats,
    streamer: BaseStreamer | None,
    do_sample: bool,
    generator: torch.Generator | None,
    recorder: ScoreRecorder,
) -> torch.Tensor:
    """One speculative step for every active row; updates `rows` in place and returns which rows finished."""
    device = model.device
    # Draft: up to k tokens per row; never more than the least advanced row can still commit.
    started = time.perf_counter()
    budget = buffer.max_length - 1 - int(buffer.active_lengths.min())
    proposal = drafter.propose(buffer, rows.next_position, policy, max_tokens=budget)
    draft_tokens = proposal.tokens  # (A, k)
    k = draft_tokens.shape[1]
    synchronize(device)
    drafted = time.perf_counter()

    # Verify: one target forward over the last committed token and the k drafts.
    verify_ids = torch.cat([rows.last_token[:, None], draft_tokens], dim=1)  # (A, k+1)
    verify_positions = rows.next_position[:, None] - 1 + torch.arange(k + 1, device=device)  # (A, k+1)
    verify_positions = verify_positions.clamp_max(buffer.max_length - 1)  # past it nothing can be kept
    every = torch.ones_like(verify_ids, dtype=torch.bool)
    logits = target.forward(verify_ids, every, verify_positions, chain_structure(k + 1, device)).logits.float()
    chain = RowTrees.chain(k + 1, device).expand(verify_ids.shape[0])
    if proposal.lengths is not None:  # a row's filler after its own drafts is never accepted
        chain = dataclasses.replace(chain, real=chain.depths <= proposal.lengths[:, None])
    scores = verification_scores(processors, buffer, verify_ids, logits, chain, do_sample)  # (A, k+1, V)

    # Accept: the longest prefix the target agrees with, then one token of the target's own.
    if not do_sample:
        num_accepted, next_token = greedy_accept(draft_tokens, scores, proposal.lengths)
    elif proposal.q is not None:
        num_accepted, next_token = speculative_sampling(draft_tokens, proposal.q, scores.softmax(dim=-1), generator)
    else:  # drafts proposed with certainty (prompt lookup)
        num_accepted, next_token = point_draft_sampling(
            draft_tokens, scores.softmax(dim=-1), proposal.lengths, generator
        )

    # Commit: append the accepted tokens (stopping where plain decoding would), roll both caches back.
    new_tokens = torch.cat([draft_tokens, next_token[:, None]], dim=1)  # (A, k+1)
    new_tokens.scatter_(1, num_accepted[:, None], next_token[:, None])
    emitted, finished = buffer.commit(new_tokens, num_accepted + 1, scores)
    recorder.record(buffer.active, emitted, scores, logits)
    stream(streamer, new_tokens, emitted)
    target.keep_prefix(k + 1, num_accepted + 1)
    drafter.commit(num_accepted, k, next_token)
    target.maybe_compact()
    rows.next_position += num_accepted + 1
    rows.last_token = next_token

    synchronize(device)
    verified = time.perf_counter()
    if proposal.source == "model":  # the draft model's length schedule learns from its own steps only
        policy.update(k, num_accepted)
    policy.observe_costs(
        drafted - started, proposal.forwards, verified - drafted, rows=verify_ids.shape[0], verified_per_row=k + 1
    )
    stats.record_step(buffer.active, k if proposal.lengths is None else proposal.lengths, num_accepted, emitted)
    stats.lookup_steps += proposal.source == "lookup"
    stats.draft_seconds += drafted - started
    stats.verify_seconds += verified - drafted
    return finished


def stream(streamer: BaseStreamer | None, tokens: torch.Tensor, emitted: torch.Tensor) -> None:
    """Send row 0's committed tokens of this step to the streamer (streamers take batch size 1)."""
    if streamer is not None:
        streamer.put(tokens[0, : int(emitted[0])].cpu())


_IGNORED_KWARGS = {"cache", "use_cache", "position_ids", "logits_to_keep"}


def reject_model_kwargs(model_kwargs: dict[str, Any]) -> None:
    """Model inputs other than token ids and a padding mask cannot be carried through speculative steps
    (the cache and positions `generate()` prepared are replaced by ours)."""
    unsupported = sorted(k for k, v in model_kwargs.items() if k not in _IGNORED_KWARGS and v is not None)
    if unsupported:
        raise ValueError(
            f"Speculative decoding takes `input_ids` and `attention_mask` only; got {unsupported}. "
            "Run plain `generate()` (without `assistant=` or `medusa=True`) for these inputs."
        )
