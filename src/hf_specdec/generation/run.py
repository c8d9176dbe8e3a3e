"""One speculative `generate()` call's state, and its steps: prefill, draft, verify, accept, commit.

`hf_specdec.generation.loop.decode` runs these in order; this module holds what they share (the target's cache,
the drafter, the token buffer, the cost model and the speculation gate, the statistics) so that each step reads
as what it does.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.modeling_outputs import CausalLMOutputWithPast

from hf_specdec.generation.acceptance import (
    greedy_accept_chain,
    greedy_accept_tree,
    sample_accept_tree,
    typical_accept_tree,
)
from hf_specdec.generation.branches import Branches, branches
from hf_specdec.generation.continuation import Continuation
from hf_specdec.generation.decisions import CostModel, SpeculationGate
from hf_specdec.generation.drafter import (
    Accepted,
    DrafterFactory,
    DraftingContext,
    FreeProposals,
    Proposal,
    chain_proposal,
)
from hf_specdec.generation.kv_cache import CachedSequence, static_capacity, wants_compile
from hf_specdec.generation.outputs import ScoreRecorder, SpeculativeDecoderOnlyOutput, SpeculativeStats, StepCounts
from hf_specdec.generation.processing import RaggedLogitsProcessor, verification_scores
from hf_specdec.generation.readback import HostReads, StepOutcome
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.generation.step_clock import StepClock
from hf_specdec.generation.streaming import PlainOrderStream
from hf_specdec.generation.validation import output_vocab_size
from hf_specdec.trees.masks import chain_structure
from hf_specdec.trees.row_trees import RowTrees


class AcceptanceRule(NamedTuple):
    """How a call accepts drafts: greedy, exact sampling, or (opt-in, lossy) typical acceptance or ensemble
    verification.

    `ensemble_weight` `w` (sampling, lossy): drafted tokens are verified against `w * p + (1 - w) * q`, the
    target's and the draft's distributions mixed, instead of the target's `p` (DIVERSE's static ensemble, as
    transformers' `assistant_ensemble_weight`): more drafts are accepted, and every token drafted at a position
    follows that mix instead of the target's distribution. Tokens the target adds follow `p`.
    """

    do_sample: bool
    typical: bool = False
    epsilon: float = 0.09
    delta: float = 0.3
    generator: torch.Generator | None = None
    ensemble_weight: float | None = None

    def __call__(self, proposal: Proposal, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(last_node, num_accepted, next_token)` per row for `proposal`, given the target's processed scores
        at every node `(A, N, V)`."""
        nodes, trees = proposal.nodes, proposal.trees
        if not self.do_sample:
            return (greedy_accept_chain if proposal.chain else greedy_accept_tree)(nodes, scores, trees)
        p = torch.softmax(scores, dim=-1)
        if self.typical:
            return typical_accept_tree(nodes, p, trees, self.epsilon, self.delta, self.generator)
        if proposal.q is None:  # children proposed with certainty
            return sample_accept_tree(nodes, p, trees, self.generator)
        if self.ensemble_weight is not None:
            p = ensemble(p, proposal.q, trees, self.ensemble_weight)
        return sample_accept_tree(nodes, p, trees, self.generator, q=proposal.q)


def ensemble(p: torch.Tensor, q: torch.Tensor, trees: RowTrees, weight: float) -> torch.Tensor:
    """`weight * p + (1 - weight) * q` at the nodes whose children were drawn from `q` `(A, <=N, V)`; `p`
    `(A, N, V)` elsewhere (leaves: the target's own token is drawn from `p`)."""
    drafted = q.shape[1]
    q = q.to(p)
    has_children = (trees.children[:, :drafted, 0] >= 0)[..., None]  # (A, <=N, 1)
    mixed = torch.where(has_children, weight * p[:, :drafted] + (1.0 - weight) * q, p[:, :drafted])
    return torch.cat([mixed, p[:, drafted:]], dim=1)


class Verified(NamedTuple):
    """The target's verification of a proposal: raw logits and processed scores at every node `(A, N, V)`, and
    its last hidden states `(A, N, H)` when the drafter reads them."""

    logits: torch.Tensor
    scores: torch.Tensor
    hidden: torch.Tensor | None


class DecodingRun:
    """The state of one speculative `generate()` call (see the module's docstring).

    Args:
        model (`PreTrainedModel`): the target.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts, on the target's device.
        attention_mask (`torch.LongTensor` of shape `(batch, prompt)`): 0 on left padding.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        make_drafter (`DrafterFactory`): builds the drafter once the context is known.
        costs (`CostModel`): the call's cost model; the run measures it after every step.
        plain_steps (`bool`): let the speculation gate take plain steps where drafting does not pay.
        generator (`torch.Generator`, *optional*): randomness for sampling.
        continuation (`Continuation`, *optional*): the caller's cache to continue from and fill as plain decoding
            does; its cached columns of `input_ids` are not prefilled again.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        make_drafter: DrafterFactory,
        costs: CostModel,
        plain_steps: bool,
        generator: torch.Generator | None,
        continuation: Continuation | None = None,
    ) -> None:
        batch, device = input_ids.shape[0], input_ids.device
        self.model, self.generation_config = model, generation_config
        self.do_sample, self.generator = bool(generation_config.do_sample), generator
        self.processors = RaggedLogitsProcessor(logits_processor)
        self.stopping_criteria = stopping_criteria
        self.recorder = ScoreRecorder(
            batch, bool(generation_config.output_scores), bool(generation_config.output_logits)
        )
        self.stats = SpeculativeStats.zeros(batch)
        self.counts = StepCounts(batch)
        self.reads = HostReads()  # the host's one read per step (see `readback`)
        self.capacity = static_capacity(generation_config, model)
        self.target = CachedSequence(model, batch, device, self.reads, capacity=self.capacity)
        context = DraftingContext(
            model, self.processors, self.do_sample, generator, output_vocab_size(model), costs, self.reads,
            generation_config,
        )  # fmt: skip
        self.drafter = make_drafter(context)
        self.costs = costs
        self.gate = SpeculationGate(costs, enabled=plain_steps)
        self.clock = StepClock(device)
        self.stream: PlainOrderStream | None = None  # set by `prefill` when the caller streams
        self.branches: Branches | None = None  # a step's trees verified path by path (recurrent targets)
        # The target's hidden states the drafter reads (its last one, or a few layers'), never every layer's.
        self.hidden_states: list[int] | bool = list(self.drafter.hidden_state_layers) or False
        self.continuation = continuation
        self.buffer: TokenBuffer  # set by `prefill`
        self.outcome: StepOutcome  # the last step's, as host values
        self.last_token: torch.Tensor  # (A,) each active row's last committed token: the next tree's root
        self.next_position: torch.Tensor  # (A,) logical position of the first drafted node
        self.speculating = True  # whether the current step drafts (else a plain one-token step)
        self.free_step = False  # whether its drafts cost no drafter forward and the gate did not ask for them
        self.laggard = 0  # the least advanced row of the current step (the batch is done when it is)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, streamer: BaseStreamer | None) -> None:
        """Prefill the target (and the drafter) on the prompts; the target's last logits give the first token."""
        valid, positions = attention_mask.bool(), prompt_positions(attention_mask)
        if streamer is not None:
            self.stream = PlainOrderStream(streamer)
        done = 0  # columns the caller's cache holds already
        if self.continuation is not None:
            self.continuation.seed(self.target, positions)
            done = self.continuation.cached
        # One padded forward, as plain `generate()` prefills: rows prefilled apart would round differently, and in
        # float32 a near-tie (a top-2 gap of 4e-5, seen by the models fuzzer) could then part from plain greedy.
        # Timed up to the first token's read (which waits for the device): the compute a token costs, which
        # prices wide verification and a draft's prefill before any step has measured them.
        started = time.perf_counter()
        out = self.target.forward(
            input_ids[:, done:],
            valid[:, done:],
            positions[:, done:],
            chain_structure(input_ids.shape[1] - done, input_ids.device),
            logits_to_keep=1,
            output_hidden_states=self.hidden_states,
        )
        if self.continuation is not None:
            self.continuation.prefilled(self.target)
        # Scratch after max_length: a step's drafted path plus the token the target adds (no path is longer than
        # the tokens left to generate, whatever a drafter's most per step).
        config = self.generation_config
        scratch = min(self.drafter.max_depth, config.max_length) + 1
        self.buffer = buffer = TokenBuffer(input_ids, config, self.stopping_criteria, scratch=scratch)
        if self.stream is not None and buffer.lockstep is not None:
            buffer.lockstep.streamer = self.stream.streamer
        if self.capacity is not None and wants_compile(self.model, self.target.cache, config):
            self.target.compile(config)  # as plain `generate()` compiles its decoding steps
        logits = out.logits[:, -1:].float()
        scores = self.processors(buffer, buffer.active, buffer.active_lengths, logits, buffer.host_lengths)
        first = choose_token(scores[:, 0], self.do_sample, self.generator)  # (B,)
        self.drafter.prefill(input_ids, valid, positions)
        emitted, finished = buffer.commit(first[:, None], torch.ones_like(first), scores)
        self.outcome = self.reads.step_outcome(torch.zeros_like(emitted), emitted, finished, 0, first[:, None])
        self.costs.observe_prefill(time.perf_counter() - started, input_ids[:, done:].numel())
        buffer.settle(self.outcome.tokens)
        self.recorder.record(buffer.active_rows, self.outcome.emitted, scores, logits)
        if self.stream is not None:
            self.stream.advance(buffer)
        self.drafter.start(first, self._drafter_states(out))
        self.last_token = first
        self.next_position = positions[:, -1] + 2

    def next_step(self) -> bool:
        """Retire the rows the last step finished; whether any row is left to decode."""
        keep = self.buffer.retire(self.outcome.finished)
        if not self.buffer.active_rows:
            return False
        if keep is not None:
            self.target.select_rows(keep)
            self.drafter.select_rows(keep)
            self.next_position, self.last_token = self.next_position[keep], self.last_token[keep]
        return True

    def draft(self) -> Proposal:
        """A tree per active row; no path longer than the least advanced row can still commit. Where drafting is
        not expected to pay (the speculation gate), a plain step: each row's last token alone, or what the drafter
        proposes at no drafter forward (`FreeProposals`)."""
        buffer, last_token = self.buffer, self.last_token
        self.clock.start()
        budget = buffer.max_length - 1 - buffer.least_advanced
        self.laggard = buffer.laggard()
        self.speculating = self.gate.speculate(last_token.shape[0])
        self.free_step = False
        proposal: Proposal | None = None
        if self.speculating:
            proposal = self.drafter.propose(buffer, last_token, self.next_position, self.costs, max_tokens=budget)
        elif not self.gate.measuring and isinstance(self.drafter, FreeProposals):  # free drafts may still pay
            proposal = self.drafter.propose_free(buffer, last_token, self.next_position, self.costs, budget)
            self.speculating = self.free_step = proposal is not None
        if proposal is None or proposal.plain:
            self.stats.plain_steps += 1
        if proposal is None:
            proposal = chain_proposal(last_token, last_token.new_zeros(last_token.shape[0], 0))
        self.clock.drafted()
        return proposal

    def verify(self, proposal: Proposal) -> Verified:
        """One target forward over every node under the trees' ancestor mask."""
        nodes, trees = proposal.nodes, proposal.trees
        if not proposal.chain and self.target.recurrent is not None:
            return self._verify_branches(proposal)
        positions = (self.next_position[:, None] - 1 + trees.depths).clamp_max(self.buffer.max_length - 1)
        out = self.target.forward(
            nodes, trees.real, positions, trees.ancestors, output_hidden_states=self.hidden_states
        )
        logits = out.logits.float()
        scores = verification_scores(
            self.processors, self.buffer, nodes, logits, trees, self.do_sample, chain=proposal.chain
        )
        return Verified(logits, scores, self._drafter_states(out))

    def _verify_branches(self, proposal: Proposal) -> Verified:
        """`verify` of trees on a target with recurrent layers: each root-to-leaf path a row of its own, verified
        as chains in one forward, each node's scores read off a path that holds it (`generation.branches`)."""
        nodes, trees = proposal.nodes, proposal.trees
        cut = branches(nodes, trees, self.next_position, self.buffer.max_length - 1)
        self.target.fork(cut.num_paths)
        width = cut.tokens.shape[1]
        out = self.target.forward(
            cut.tokens, cut.valid, cut.positions, chain_structure(width, nodes.device),
            output_hidden_states=self.hidden_states,
        )  # fmt: skip
        self.branches = cut
        logits = cut.node_states(out.logits.float())  # (A, N, V)
        scores = verification_scores(self.processors, self.buffer, nodes, logits, trees, self.do_sample, chain=False)
        hidden = self._drafter_states(out)
        return Verified(logits, scores, None if hidden is None else cut.node_states(hidden))

    def _drafter_states(self, out: CausalLMOutputWithPast) -> torch.Tensor | None:
        """The target's hidden states the drafter reads, concatenated (`None` when it reads none)."""
        if not self.hidden_states:
            return None
        states = [out.hidden_states[i] for i in self.drafter.hidden_state_layers]
        return states[0] if len(states) == 1 else torch.cat(states, dim=-1)

    def commit(
        self,
        proposal: Proposal,
        verified: Verified,
        accepted: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> None:
        """Commit the accepted path's tokens (stopping where plain decoding would) and KV entries, in order; tell
        the drafter; learn the step's costs."""
        last_node, num_accepted, next_token = accepted
        nodes, trees, buffer = proposal.nodes, proposal.trees, self.buffer
        path_nodes = trees.path_to(last_node)  # (A, D+1), the root first
        drafts = nodes[:, 1:] if proposal.chain else nodes.gather(1, path_nodes[:, 1:].clamp_min(0))
        next_column = next_token[:, None]
        new_tokens = torch.cat([drafts, next_column], dim=1).scatter_(1, num_accepted[:, None], next_column)
        path_scores, path_logits = self._path_scores(proposal, path_nodes, verified)
        emitted, finished = buffer.commit(new_tokens, num_accepted + 1, path_scores)
        drafted_per_row = proposal.drafted if proposal.drafted is not None else trees.row_depths
        # The step's one read: what the host needs to steer the next step.
        self.outcome = outcome = self.reads.step_outcome(num_accepted, emitted, finished, drafted_per_row, new_tokens)
        buffer.settle(outcome.tokens)
        if self.recorder.keep_scores or self.recorder.keep_logits:
            self.recorder.record(buffer.active_rows, outcome.emitted, path_scores, path_logits)
        if self.stream is not None:
            self.stream.advance(buffer)
        real_kept = [accepted + 1 for accepted in outcome.num_accepted]
        if self.branches is not None:  # each row keeps the path holding its accepted node: a chain in that row
            self.target.join(self.branches.kept_rows(last_node))
            self.target.keep_prefix(
                self.branches.tokens.shape[1], num_accepted + 1, outcome.max_accepted + 1, real_kept
            )
            self.branches = None
        else:
            self.target.keep_path(
                trees.num_nodes, path_nodes, num_accepted + 1, is_prefix=proposal.chain,
                keep_max=outcome.max_accepted + 1, real_kept=real_kept,
            )  # fmt: skip
        self.target.maybe_compact()
        hidden = None
        if verified.hidden is not None:  # the target's last hidden state at every node of the accepted path
            states = verified.hidden
            hidden = states.gather(1, path_nodes.clamp_min(0)[..., None].expand(-1, -1, states.shape[-1]))
        step = Accepted(path_nodes, num_accepted, next_token, new_tokens, emitted, hidden, outcome)
        if self.speculating:
            self.drafter.commit(step)
        else:
            self.drafter.follow(step)
        self.next_position = self.next_position + num_accepted + 1
        self.last_token = next_token
        self._observe(proposal)

    def _path_scores(
        self, proposal: Proposal, path_nodes: torch.Tensor, verified: Verified
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The processed and raw scores that chose each committed token `(A, D+1, V)`, for stopping criteria and
        `output_scores`/`output_logits`; a chain's are its scores as they are, a tree's are gathered along the
        accepted path only when something reads them."""
        scores, logits = verified.scores, verified.logits
        if proposal.chain:
            return scores, logits
        if not (self.recorder.keep_scores or self.recorder.keep_logits or self.buffer.needs_scores):
            return None, None
        on_path = path_nodes.clamp_min(0)[:, :, None].expand(-1, -1, scores.shape[-1])  # (A, D+1, V)
        return scores.gather(1, on_path), logits.gather(1, on_path)

    def _observe(self, proposal: Proposal) -> None:
        """Time the step for the cost model and the gate, and count it in the statistics."""
        outcome, stats = self.outcome, self.stats
        rows, width = proposal.nodes.shape
        gained = 1 + outcome.num_accepted[self.laggard]
        if proposal.chain and proposal.forwards > 0 and not proposal.looked_up:  # a drafter's own chain
            self.costs.observe_acceptance(rows, outcome.num_accepted[self.laggard], outcome.drafted[self.laggard])
        timings = self.clock.verified(
            proposal.forwards, rows, width, gained, proposal.catch_up, self.free_step, proposal.started
        )
        for timing in timings:
            if timing.started:  # the draft's prefill, paid once: no measure of what a step costs
                continue
            # A step that began by catching the draft up tells nothing of what one draft forward costs.
            forwards = 0 if timing.catch_up else timing.forwards
            self.costs.observe(timing.draft, forwards, timing.verify, timing.rows, timing.width)
            # The batch finishes with its least advanced row: a step pays if it advances that row faster than
            # plain steps would (rows ahead of it finishing sooner barely shortens the call).
            self.gate.observe(
                timing.gained, timing.draft + timing.verify, timing.forwards, timing.rows, timing.width, timing.verify,
                free=timing.free,
            )  # fmt: skip
        self.counts.record(self.buffer.active_rows, outcome.drafted, outcome.num_accepted, outcome.emitted)
        stats.lookup_steps += proposal.looked_up
        stats.draft_forwards += proposal.forwards
        stats.verify_widths[width] = stats.verify_widths.get(width, 0) + 1
        stats.draft_seconds, stats.verify_seconds = self.clock.draft_seconds, self.clock.verify_seconds

    def finish(self, device: torch.device) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
        """End the streamer and return `generate()`'s result on `device` (the statistics with it when
        `return_dict_in_generate=True`)."""
        self.counts.write(self.stats)
        self.stats.costs = self.costs.estimated
        self.costs.keep()  # for the next call of the same models (`decisions.memory`)
        if self.stream is not None:
            self.stream.end(self.buffer)
        config, buffer, recorder = self.generation_config, self.buffer, self.recorder
        pad = config._pad_token_tensor
        sequences = buffer.sequences(int(pad) if pad is not None else 0)
        cache = None
        if self.continuation is not None:
            cache = self.continuation.finish(self.model, self.target, sequences)
        sequences = sequences.to(device)
        if not config.return_dict_in_generate:
            return sequences
        recorder.trim(buffer.lengths - buffer.prompt_length)
        return SpeculativeDecoderOnlyOutput(
            sequences=sequences, scores=recorder.scores(), logits=recorder.logits(), cache=cache, speculative=self.stats
        )


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Logical positions `(batch, prompt)` of left-padded prompt tokens, as plain `generate()` computes them."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


def choose_token(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from processed scores `(batch, vocab)`: a sample, or the argmax."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)
    return scores.argmax(dim=-1)
