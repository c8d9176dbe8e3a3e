"""The speculative decoding loop: draft, verify, accept, commit.

`speculative_decode` is handed to transformers' `generate()` as its decoding method, after `generate()` has
prepared the inputs, the generation config, the logits processors and the stopping criteria exactly as for
plain decoding. Every row of the batch runs its own acceptance; finished rows leave the batch.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.acceptance import greedy_accept, speculative_sampling
from hf_specdec.draft_length import DraftLengthPolicy
from hf_specdec.drafter import DraftModelDrafter
from hf_specdec.kv_cache import CachedSequence
from hf_specdec.masks import chain_structure
from hf_specdec.outputs import SpeculativeDecoderOnlyOutput, SpeculativeStats
from hf_specdec.processing import RaggedLogitsProcessor
from hf_specdec.sequences import TokenBuffer

# Compact a cache once holes make up this share of its slots (and at least _MIN_WASTE slots).
_COMPACT_FRACTION = 0.25
_MIN_WASTE = 32


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Logical positions of left-padded prompt tokens `(batch, prompt)`, as plain `generate()` computes them."""
    positions = attention_mask.long().cumsum(dim=1) - 1
    return positions.clamp_min(0)


def _choose(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from processed scores `(batch, vocab)`."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)
    return scores.argmax(dim=-1)


def _maybe_compact(seq: CachedSequence) -> None:
    waste = seq.num_slots - int(seq.valid.sum(dim=1).max())
    if waste >= _MIN_WASTE and waste >= _COMPACT_FRACTION * seq.num_slots:
        seq.compact()


@torch.no_grad()
def speculative_decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    assistant: PreTrainedModel,
    draft_length: DraftLengthPolicy,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """Generate with a draft model, keeping the target's greedy tokens or its sampling distribution exactly.

    Args:
        model (`PreTrainedModel`): the target.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        assistant (`PreTrainedModel`): the draft model.
        draft_length (`DraftLengthPolicy`): how many tokens to draft per step.
        streamer (`BaseStreamer`, *optional*): receives each step's committed tokens (batch size 1).
        generator (`torch.Generator`, *optional*): randomness for sampling, for reproducible runs.
        model_kwargs: `attention_mask` `(batch, prompt)`, 0 on left padding (`None` when there is none);
            the cache and positions `generate()` prepared are ignored, anything else is refused.

    Returns:
        `torch.LongTensor` `(batch, prompt + new)`, or a `SpeculativeDecoderOnlyOutput` when
        `return_dict_in_generate=True`.
    """
    attention_mask = model_kwargs.pop("attention_mask", None)
    _reject_model_kwargs(model_kwargs)
    device = input_ids.device
    batch, prompt = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    do_sample = bool(generation_config.do_sample)
    processors = RaggedLogitsProcessor(logits_processor)
    buffer = TokenBuffer(
        input_ids,
        generation_config.max_length,
        scratch=draft_length.max_tokens + 2,
        eos_token_ids=generation_config._eos_token_tensor,
        stopping_criteria=stopping_criteria,
    )
    stats = SpeculativeStats.zeros(batch)

    # Prefill both models on the prompts; the target's last logits give the first token.
    valid = attention_mask.bool()
    positions = prompt_positions(attention_mask)
    target = CachedSequence(model, batch, device)
    out = target.forward(input_ids, valid, positions, chain_structure(prompt, device), logits_to_keep=1)
    logits = out.logits[:, -1:].float()  # (B, 1, V)
    vocab_size = logits.shape[-1]
    scores = processors(buffer.tokens, buffer.active, buffer.active_lengths, logits)  # (B, 1, V)
    first = _choose(scores[:, 0], do_sample, generator)  # (B,)
    drafter = DraftModelDrafter(assistant, vocab_size, processors, do_sample, generator)
    drafter.prefill(input_ids, valid, positions)

    emitted, finished = buffer.commit(first[:, None], torch.ones_like(first), scores)
    _stream(streamer, first[:, None], emitted)
    drafter.start(first)
    next_position = positions[:, -1] + 2  # (A,) logical position of the first draft of the next step
    last_token = first  # (A,) committed but not yet fed to the target

    while True:
        keep = buffer.retire(finished)
        if keep.numel() < finished.numel():
            if keep.numel() == 0:
                break
            target.select_rows(keep)
            drafter.select_rows(keep)
            next_position, last_token = next_position[keep], last_token[keep]

        # Draft: k tokens per row from the draft model.
        started = time.perf_counter()
        draft_tokens, q = drafter.propose(buffer, next_position, draft_length)  # (A, k), (A, k, V) | None
        k = draft_tokens.shape[1]
        drafted = time.perf_counter()

        # Verify: one target forward over the last committed token and the k drafts.
        verify_ids = torch.cat([last_token[:, None], draft_tokens], dim=1)  # (A, k+1)
        verify_positions = next_position[:, None] - 1 + torch.arange(k + 1, device=device)  # (A, k+1)
        logits = target.forward(
            verify_ids,
            torch.ones_like(verify_ids, dtype=torch.bool),
            verify_positions,
            chain_structure(k + 1, device),
        ).logits.float()  # (A, k+1, V)
        scores = processors(buffer.tokens, buffer.active, buffer.active_lengths, logits)  # (A, k+1, V)

        # Accept: the longest prefix the target agrees with, then one token of the target's own.
        if do_sample:
            assert q is not None
            p = torch.softmax(scores, dim=-1)  # (A, k+1, V)
            num_accepted, next_token = speculative_sampling(draft_tokens, q, p, generator)
        else:
            num_accepted, next_token = greedy_accept(draft_tokens, scores)
        stats.record_step(buffer.active, k, num_accepted)  # moves counts to the host: the step is done
        draft_length.update(k, num_accepted)
        verified = time.perf_counter()
        draft_length.observe_costs(drafted - started, k, verified - drafted)
        stats.draft_seconds += drafted - started
        stats.verify_seconds += verified - drafted

        # Commit: append the accepted tokens, roll both caches back to them.
        new_tokens = torch.cat([draft_tokens, next_token[:, None]], dim=1)  # (A, k+1)
        new_tokens.scatter_(1, num_accepted[:, None], next_token[:, None])
        emitted, finished = buffer.commit(new_tokens, num_accepted + 1, scores)
        _stream(streamer, new_tokens, emitted)
        target.keep_prefix(k + 1, num_accepted + 1)
        drafter.commit(num_accepted, k, next_token)
        next_position = next_position + num_accepted + 1
        last_token = next_token
        _maybe_compact(target)
        if drafter.seq is not None:
            _maybe_compact(drafter.seq)

    if streamer is not None:
        streamer.end()
    pad = generation_config._pad_token_tensor
    sequences = buffer.sequences(int(pad) if pad is not None else 0)
    if generation_config.return_dict_in_generate:
        return SpeculativeDecoderOnlyOutput(sequences=sequences, speculative=stats)
    return sequences


def _stream(streamer: BaseStreamer | None, tokens: torch.Tensor, emitted: torch.Tensor) -> None:
    if streamer is not None:
        streamer.put(tokens[0, : int(emitted[0])].cpu())


_IGNORED_KWARGS = {"cache", "use_cache", "position_ids", "logits_to_keep"}


def _reject_model_kwargs(model_kwargs: dict[str, Any]) -> None:
    """Model inputs other than token ids and a padding mask cannot be carried through drafting."""
    unsupported = sorted(k for k, v in model_kwargs.items() if k not in _IGNORED_KWARGS and v is not None)
    if unsupported:
        raise ValueError(
            f"Speculative decoding takes `input_ids` and `attention_mask` only; got {unsupported}. "
            "Run plain `generate()` (without `assistant=`) for these inputs."
        )
