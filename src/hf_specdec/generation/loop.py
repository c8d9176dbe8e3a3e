"""The speculative decoding loop: draft, verify, accept, commit, for every drafter.

`decode` is handed to transformers' `generate()` as its decoding method (through its `custom_generate` hook),
after `generate()` has prepared the inputs, the generation config, the logits processors and the stopping
criteria exactly as for plain decoding. Each step a drafter proposes a tree per row rooted at the row's last
committed token (a chain is a tree of width one: a draft model, prompt lookup; Medusa heads grow real trees);
the target scores every node in one forward under the trees' attention mask; an acceptance rule keeps the
deepest node whose path the target agrees with (greedy: token-identical to plain greedy decoding; sampling:
the target's distribution exactly) and adds one token of the target's own; the path is committed to the
tokens, the target's KV cache and the drafter. Every row of the batch runs its own acceptance; finished rows
leave the batch.

The loop knows drafters only through their protocol (`hf_specdec.drafters.base`): draft models and prompt lookup
enter through `hf_specdec.drafters.decoding.speculative_decode` (`generate(assistant=... |
prompt_lookup_num_tokens=...)`), Medusa and EAGLE heads through `hf_specdec.medusa.decoding.medusa_decode`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.drafters.base import Accepted, DrafterFactory, DraftingContext, Proposal, chain_proposal
from hf_specdec.generation.acceptance import greedy_accept_tree, sample_accept_tree, typical_accept_tree
from hf_specdec.generation.cost_model import SpeculationGate
from hf_specdec.generation.draft_length import DraftLengthPolicy
from hf_specdec.generation.inputs import check_prompts
from hf_specdec.generation.kv_cache import CachedSequence, static_capacity, wants_compile
from hf_specdec.generation.outputs import ScoreRecorder, SpeculativeDecoderOnlyOutput, SpeculativeStats
from hf_specdec.generation.positions import check_position_limits
from hf_specdec.generation.processing import RaggedLogitsProcessor, verification_scores
from hf_specdec.generation.readback import HostReads, StepOutcome
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.generation.step_clock import StepClock
from hf_specdec.generation.validation import check_generation_config, output_vocab_size
from hf_specdec.trees.masks import chain_structure

ACCEPTANCE = ("exact", "typical")


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Logical positions `(batch, prompt)` of left-padded prompt tokens, as plain `generate()` computes them."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


def choose_token(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from processed scores `(batch, vocab)`: a sample, or the argmax."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)
    return scores.argmax(dim=-1)


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    make_drafter: DrafterFactory,
    costs: DraftLengthPolicy,
    path: str,
    plain_steps: bool = True,
    acceptance: str = "exact",
    typical_epsilon: float = 0.09,
    typical_delta: float = 0.3,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """The speculative decoding loop, for any drafter.

    Args:
        model (`PreTrainedModel`): the target.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        make_drafter (`DrafterFactory`): builds the drafter once the loop knows its processors and sizes.
        costs (`DraftLengthPolicy`): measures (or holds fixed) the costs drafters weigh; the draft model's
            length schedule.
        path (`str`): how error messages name the speculative path the user chose.
        plain_steps (`bool`): take plain one-token steps where drafting is not expected to pay
            (`SpeculationGate`); otherwise draft at every step.
        acceptance (`str`): `"exact"` (greedy identity, or the target's exact distribution when sampling) or
            `"typical"` (Medusa's typical acceptance when sampling: faster, **lossy**).
        typical_epsilon, typical_delta: the typical acceptance's threshold and entropy factor.
        streamer (`BaseStreamer`, *optional*): receives each step's committed tokens (batch size 1).
        generator (`torch.Generator`, *optional*): randomness for sampling, for reproducible runs.
        model_kwargs: `attention_mask` `(batch, prompt)`, 0 on left padding (`None` when there is none);
            the cache and positions `generate()` prepared are ignored, anything else is refused.

    Returns:
        `torch.LongTensor` `(batch, prompt + new)` on the device of `input_ids`, or a
        `SpeculativeDecoderOnlyOutput` when `return_dict_in_generate=True`.
    """
    check_generation_config(generation_config, per_token_scores=True, path=path)
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}.")
    if acceptance == "typical" and not generation_config.do_sample:
        raise ValueError("Typical acceptance is a sampling rule: pass do_sample=True, or use the exact rule.")
    attention_mask = model_kwargs.pop("attention_mask", None)
    reject_model_kwargs(model_kwargs)
    check_prompts(model, input_ids, attention_mask)
    check_position_limits(model, generation_config.max_length)
    input_device, device = input_ids.device, model.device
    input_ids = input_ids.to(device=device, dtype=torch.long)  # plain generate() takes any integer ids
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    do_sample = bool(generation_config.do_sample)
    processors = RaggedLogitsProcessor(logits_processor)
    recorder = ScoreRecorder(
        input_ids.shape[0], bool(generation_config.output_scores), bool(generation_config.output_logits)
    )
    stats = SpeculativeStats.zeros(input_ids.shape[0])

    # Prefill the target (and the drafter) on the prompts; the target's last logits give the first token.
    valid, positions = attention_mask.bool(), prompt_positions(attention_mask)
    reads = HostReads()  # the host's one read per step (see `readback`)
    capacity = static_capacity(generation_config, model)
    target = CachedSequence(model, input_ids.shape[0], device, reads, capacity=capacity)
    context = DraftingContext(
        model, processors, do_sample, generator, output_vocab_size(model), costs, reads, generation_config
    )
    drafter = make_drafter(context)
    cost_model = costs.cost_model
    gate = SpeculationGate(cost_model, enabled=plain_steps)
    clock = StepClock(device)
    hidden_states = drafter.needs_hidden_states
    out = target.forward(
        input_ids,
        valid,
        positions,
        chain_structure(input_ids.shape[1], device),
        logits_to_keep=1,
        output_hidden_states=hidden_states,
    )
    # Scratch after max_length: a step's drafted path plus the token the target adds (no path is longer than
    # the tokens left to generate, whatever a drafter's most per step).
    scratch = min(drafter.max_depth, generation_config.max_length) + 1
    buffer = TokenBuffer(input_ids, generation_config, stopping_criteria, scratch=scratch)
    if capacity is not None and wants_compile(model, target.cache, generation_config):
        target.compile(generation_config)  # as plain `generate()` compiles its decoding steps
    logits = out.logits[:, -1:].float()
    scores = processors(buffer, buffer.active, buffer.active_lengths, logits)  # (B, 1, V)
    last_token = choose_token(scores[:, 0], do_sample, generator)  # (B,)
    drafter.prefill(input_ids, valid, positions)
    emitted, finished = buffer.commit(last_token[:, None], torch.ones_like(last_token), scores)
    outcome = reads.step_outcome(torch.zeros_like(emitted), emitted, finished, 0, last_token[:, None])
    buffer.settle(outcome.tokens)
    recorder.record(buffer.active_rows, outcome.emitted, scores, logits)
    stream(streamer, outcome)
    drafter.start(last_token, out.hidden_states[-1] if hidden_states else None)
    next_position = positions[:, -1] + 2  # (B,) logical position of the first drafted node

    while True:
        keep = buffer.retire(outcome.finished)
        if not buffer.active_rows:
            break
        if keep is not None:
            target.select_rows(keep)
            drafter.select_rows(keep)
            next_position, last_token = next_position[keep], last_token[keep]

        # Draft: a tree per row; no path longer than the least advanced row can still commit. Where drafting is
        # not expected to pay, a plain step: each row's last token alone.
        clock.start()
        budget = buffer.max_length - 1 - buffer.least_advanced
        laggard = buffer.laggard()  # the least advanced row: the batch is done when it is
        speculating = gate.speculate(last_token.shape[0])
        if speculating:
            proposal = drafter.propose(buffer, last_token, next_position, costs, max_tokens=budget)
        else:
            proposal = chain_proposal(last_token, last_token.new_zeros(last_token.shape[0], 0))
        nodes, trees = proposal.nodes, proposal.trees
        clock.drafted()

        # Verify: one target forward over every node under the trees' ancestor mask.
        node_positions = (next_position[:, None] - 1 + trees.depths).clamp_max(buffer.max_length - 1)
        out = target.forward(nodes, trees.real, node_positions, trees.ancestors, output_hidden_states=hidden_states)
        logits = out.logits.float()
        scores = verification_scores(processors, buffer, nodes, logits, trees, do_sample)  # (A, N, V)

        # Accept: the deepest node with a right path, then one token of the target's own.
        last_node, num_accepted, next_token = _accept(
            proposal, scores, do_sample, acceptance, typical_epsilon, typical_delta, generator
        )

        # Commit: the accepted path's tokens (stopping where plain decoding would) and KV entries, in order.
        path_nodes = trees.path_to(last_node)  # (A, D+1), the root first
        new_tokens = torch.cat([nodes.gather(1, path_nodes[:, 1:].clamp_min(0)), next_token[:, None]], dim=1)
        new_tokens.scatter_(1, num_accepted[:, None], next_token[:, None])  # (A, D+1)
        path_scores, path_logits = _path_scores(proposal, path_nodes, scores, logits, recorder, buffer)
        emitted, finished = buffer.commit(new_tokens, num_accepted + 1, path_scores)
        drafted_per_row = proposal.drafted if proposal.drafted is not None else trees.row_depths
        # The step's one read: what the host needs to steer the next step.
        outcome = reads.step_outcome(num_accepted, emitted, finished, drafted_per_row, new_tokens)
        buffer.settle(outcome.tokens)
        if recorder.keep_scores or recorder.keep_logits:
            recorder.record(buffer.active_rows, outcome.emitted, path_scores, path_logits)
        stream(streamer, outcome)
        target.keep_path(
            trees.num_nodes, path_nodes, num_accepted + 1, is_prefix=proposal.chain, keep_max=outcome.max_accepted + 1
        )
        target.maybe_compact()
        hidden = None
        if hidden_states:  # the target's last hidden state at every node of the accepted path
            states = out.hidden_states[-1]  # (A, N, H)
            hidden = states.gather(1, path_nodes.clamp_min(0)[..., None].expand(-1, -1, states.shape[-1]))
        accepted = Accepted(path_nodes, num_accepted, next_token, new_tokens, emitted, hidden, outcome)
        if speculating:
            drafter.commit(accepted)
        else:
            drafter.follow(accepted)
        next_position = next_position + num_accepted + 1
        last_token = next_token

        rows, width = nodes.shape
        for timing in clock.verified(proposal.forwards, rows, width, 1 + outcome.num_accepted[laggard]):
            cost_model.observe(timing.draft, timing.forwards, timing.verify, timing.rows, timing.width)
            # The batch finishes with its least advanced row: a step pays if it advances that row faster than
            # plain steps would (rows ahead of it finishing sooner barely shortens the call).
            gate.observe(
                timing.gained, timing.draft + timing.verify, timing.forwards, timing.rows, timing.width, timing.verify
            )
        stats.record_step(buffer.active_rows, outcome.drafted, outcome.num_accepted, outcome.emitted)
        stats.lookup_steps += proposal.looked_up
        stats.draft_forwards += proposal.forwards
        stats.verify_widths[width] = stats.verify_widths.get(width, 0) + 1
        stats.draft_seconds, stats.verify_seconds = clock.draft_seconds, clock.verify_seconds

    stats.costs = cost_model.estimated
    stats.plain_steps = gate.plain_steps
    return finish(buffer, generation_config, stats, streamer, input_device, recorder)


def _path_scores(
    proposal: Proposal,
    path_nodes: torch.Tensor,
    scores: torch.Tensor,
    logits: torch.Tensor,
    recorder: ScoreRecorder,
    buffer: TokenBuffer,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The processed and raw scores that chose each committed token `(A, D+1, V)`, for stopping criteria and
    `output_scores`/`output_logits`; a chain's are its scores as they are, a tree's are gathered along the
    accepted path only when something reads them."""
    if proposal.chain:
        return scores, logits
    if not (recorder.keep_scores or recorder.keep_logits or buffer.criteria):
        return None, None
    on_path = path_nodes.clamp_min(0)[:, :, None].expand(-1, -1, scores.shape[-1])  # (A, D+1, V)
    return scores.gather(1, on_path), logits.gather(1, on_path)


def _accept(
    proposal: Proposal,
    scores: torch.Tensor,
    do_sample: bool,
    acceptance: str,
    typical_epsilon: float,
    typical_delta: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(last_node, num_accepted, next_token)` per row, by the acceptance rule of this call."""
    nodes, trees = proposal.nodes, proposal.trees
    if not do_sample:
        return greedy_accept_tree(nodes, scores, trees)
    p = torch.softmax(scores, dim=-1)
    if acceptance == "typical":
        return typical_accept_tree(nodes, p, trees, typical_epsilon, typical_delta, generator)
    if proposal.q is None:  # children proposed with certainty
        return sample_accept_tree(nodes, p, trees, generator)
    return sample_accept_tree(nodes, p, trees, generator, q=proposal.q)


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


def stream(streamer: BaseStreamer | None, outcome: StepOutcome) -> None:
    """Send row 0's committed tokens of this step to the streamer (streamers take batch size 1)."""
    if streamer is not None:
        streamer.put(torch.tensor(outcome.tokens[0], dtype=torch.long))


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
