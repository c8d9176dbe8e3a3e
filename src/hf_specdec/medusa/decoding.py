"""Medusa decoding: candidates from the heads (a static or a dynamic tree, with prompt lookup's continuation
grafted on when asked), one tree forward, accept the deepest node whose path is right, commit its path.

Handed to transformers' `generate()` as its decoding method (like [`speculative_decode`]), so generation
configs, processors, stopping criteria and streamers work as in plain decoding.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.decoding import choose_token, finish, prompt_positions, reject_model_kwargs, stream, synchronize
from hf_specdec.draft_length import DraftLengthPolicy, SpeculativeCosts
from hf_specdec.dynamic_tree import DynamicTree
from hf_specdec.inputs import check_prompts
from hf_specdec.kv_cache import CachedSequence
from hf_specdec.lookup import PromptLookupDrafter
from hf_specdec.masks import chain_structure
from hf_specdec.medusa.heads import DraftHeads
from hf_specdec.outputs import ScoreRecorder, SpeculativeDecoderOnlyOutput, SpeculativeStats
from hf_specdec.processing import RaggedLogitsProcessor, verification_scores
from hf_specdec.row_trees import RowTrees
from hf_specdec.sequences import TokenBuffer
from hf_specdec.tree import DraftTree
from hf_specdec.tree_acceptance import greedy_accept_tree, sample_accept_tree, typical_accept_tree
from hf_specdec.tree_lookup import graft_chains
from hf_specdec.validation import check_generation_config

ACCEPTANCE = ("exact", "typical")


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
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """Generate with Medusa heads verifying a tree of candidates per step.

    Args:
        model (`PreTrainedModel`): the base model.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        heads (`DraftHeads`): the heads on the base's last hidden state (Medusa's or recurrent ones).
        tree (`DraftTree` or `DynamicTree`): which candidates to verify: the same tree at every step, or one
            grown per row and step from the heads' probabilities.
        acceptance (`str`): `"exact"` (greedy identity, or the target's exact distribution when sampling) or
            `"typical"` (Medusa's typical acceptance when sampling: faster, **lossy**).
        prompt_lookup (`PromptLookupDrafter`, *optional*): also graft each row's prompt-lookup continuation onto
            its tree (`hf_specdec.tree_lookup`), as long as the measured acceptance of its matches pays for
            verifying it.
        costs (`SpeculativeCosts`, *optional*): with `prompt_lookup`, fixed costs instead of measured ones (see
            `hf_specdec.draft_length`).
        streamer, generator: as for [`speculative_decode`].

    Returns:
        `torch.LongTensor` `(batch, prompt + new)`, or a `SpeculativeDecoderOnlyOutput`.
    """
    if isinstance(tree, DynamicTree) and tree.depth is None:
        raise ValueError("medusa_decode needs a DynamicTree with a depth (generate() sets the heads' own).")
    check_generation_config(generation_config, per_token_scores=True, path="`medusa=True`")
    check_prompts(model, input_ids, model_kwargs.get("attention_mask"))
    if acceptance == "typical" and not generation_config.do_sample:
        raise ValueError("Typical acceptance is a sampling rule: pass do_sample=True, or use the exact rule.")
    attention_mask = model_kwargs.pop("attention_mask", None)
    reject_model_kwargs(model_kwargs)
    do_sample = bool(generation_config.do_sample)
    input_device, device = input_ids.device, model.device
    input_ids = input_ids.to(device=device, dtype=torch.long)  # plain generate() takes any integer ids
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    processors = RaggedLogitsProcessor(logits_processor)
    longest = max(tree.depth, prompt_lookup.num_tokens if prompt_lookup is not None else 0)
    buffer = TokenBuffer(input_ids, generation_config, stopping_criteria, scratch=longest + 1)
    static = RowTrees.from_tree(tree, device) if isinstance(tree, DraftTree) else None
    stats = SpeculativeStats.zeros(input_ids.shape[0])
    recorder = ScoreRecorder(
        input_ids.shape[0], bool(generation_config.output_scores), bool(generation_config.output_logits)
    )

    valid, positions = attention_mask.bool(), prompt_positions(attention_mask)
    target = CachedSequence(model, input_ids.shape[0], device)
    structure = chain_structure(input_ids.shape[1], device)
    out = target.forward(input_ids, valid, positions, structure, logits_to_keep=1, output_hidden_states=True)
    if prompt_lookup is not None:
        prompt_lookup.prefill(input_ids, valid, positions)
        # Measures what verifying one more token costs, which decides how far a match is worth grafting.
        costs = None if costs is None else dataclasses.replace(costs, draft_forward=0.0)
        policy = DraftLengthPolicy(
            num_tokens=prompt_lookup.num_tokens, schedule="constant", cost_ratio=0.0, costs=costs
        )
    logits = out.logits[:, -1:].float()
    scores = processors(buffer, buffer.active, buffer.active_lengths, logits)
    last_token = choose_token(scores[:, 0], do_sample, generator)  # (B,)
    hidden = out.hidden_states[-1][:, -1:]  # (B, 1, H) the state the heads read
    emitted, finished = buffer.commit(last_token[:, None], torch.ones_like(last_token), scores)
    recorder.record(buffer.active, emitted, scores, logits)
    stream(streamer, last_token[:, None], emitted)
    next_position = positions[:, -1] + 2  # (A,) position of the first drafted node
    lm_head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()

    while True:
        keep = buffer.retire(finished)
        if keep.numel() == 0:
            break
        if keep.numel() < finished.numel():
            target.select_rows(keep)
            next_position, last_token, hidden = next_position[keep], last_token[keep], hidden[keep]
            if prompt_lookup is not None:
                prompt_lookup.select_rows(keep)
        started = time.perf_counter()
        # Draft: the heads' top candidates fill the tree (the same tree every step, or grown per row).
        if static is not None:
            nodes = heads.tree_candidates(hidden[:, -1], last_token, tree, lm_head, embeddings)  # (A, N)
            trees = static.expand(nodes.shape[0])
        else:
            nodes, trees = heads.dynamic_candidates(hidden[:, -1], last_token, tree, lm_head, embeddings)
        if prompt_lookup is not None:
            budget = buffer.max_length - 1 - int(buffer.active_lengths.min())
            proposal = prompt_lookup.propose(buffer, next_position, policy, max_tokens=budget)
            nodes, trees = graft_chains(nodes, trees, proposal.tokens, proposal.lengths)
            stats.lookup_steps += int(bool((proposal.lengths > 0).any()))
        synchronize(device)
        drafted = time.perf_counter()
        # Verify: one forward over the whole tree under its ancestor mask.
        node_positions = (next_position[:, None] - 1 + trees.depths).clamp_max(buffer.max_length - 1)
        out = target.forward(nodes, trees.real, node_positions, trees.ancestors, output_hidden_states=True)
        logits = out.logits.float()
        scores = verification_scores(processors, buffer, nodes, logits, trees, do_sample)  # (A, N, V)
        # Accept: the deepest node with a right path.
        if not do_sample:
            last_node, num_accepted, next_token = greedy_accept_tree(nodes, scores, trees)
        elif acceptance == "typical":
            p = torch.softmax(scores, dim=-1)
            last_node, num_accepted, next_token = typical_accept_tree(
                nodes, p, trees, typical_epsilon, typical_delta, generator
            )
        else:
            last_node, num_accepted, next_token = sample_accept_tree(
                nodes, torch.softmax(scores, dim=-1), trees, generator
            )
        # Commit: the accepted path's tokens and KV entries, in order.
        path_nodes = trees.path_to(last_node)  # (A, D+1), the root first
        new_tokens = nodes.gather(1, path_nodes[:, 1:].clamp_min(0))  # (A, D)
        new_tokens = torch.cat([new_tokens, next_token[:, None]], dim=1)  # (A, D+1)
        new_tokens.scatter_(1, num_accepted[:, None], next_token[:, None])
        on_path = path_nodes.clamp_min(0)[:, :, None].expand(-1, -1, scores.shape[-1])  # (A, D+1, V)
        path_scores, path_logits = scores.gather(1, on_path), logits.gather(1, on_path)  # what chose each token
        emitted, finished = buffer.commit(new_tokens, num_accepted + 1, path_scores)
        recorder.record(buffer.active, emitted, path_scores, path_logits)
        stream(streamer, new_tokens, emitted)
        if prompt_lookup is not None:
            prompt_lookup.observe(new_tokens, emitted)
        target.keep_nodes(trees.num_nodes, path_nodes, num_accepted + 1)
        target.maybe_compact()
        states = out.hidden_states[-1]  # (A, N, H)
        hidden = states.gather(1, last_node[:, None, None].expand(-1, -1, states.shape[-1]))  # (A, 1, H)
        next_position = next_position + num_accepted + 1
        last_token = next_token
        synchronize(device)
        verified = time.perf_counter()
        if prompt_lookup is not None:
            rows, width = nodes.shape
            policy.observe_costs(drafted - started, 0, verified - drafted, rows=rows, verified_per_row=width)
        stats.record_step(buffer.active, trees.row_depths, num_accepted, emitted)
        stats.draft_seconds += drafted - started
        stats.verify_seconds += verified - drafted

    if prompt_lookup is not None:
        stats.costs = policy.estimated_costs
    return finish(buffer, generation_config, stats, streamer, input_device, recorder)
