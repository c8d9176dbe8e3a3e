"""A draft model that proposes a tree per row: `generate(assistant=draft, tree=DynamicTree(...))`.

A chain bets every draft on the draft's single best continuation; where the draft hesitates between two
tokens, a tree verifies both in the same target forward. The tree grows as Medusa's dynamic trees do (after
EAGLE-2, `hf_specdec.trees.dynamic`): from the root (the row's last committed token), depth by depth, every
frontier node gets the draft's `top_k` likeliest next tokens, and the `top_k` best-scored of those (by the
draft's probability of their whole path) become the next frontier, fed to the draft in one forward under a
tree mask (each node sees the committed tokens and its own ancestors); then the `num_nodes` best-scored nodes
form the tree the target verifies. One draft forward per depth, whatever the width. With the adaptive schedule
(the default) growing stops early once one more depth is not expected to pay for its draft forward, as chains
stop drafting (`DraftTreeDrafter.propose`).

The draft's probabilities are processed by the call's logits processors, each node with its own prefix, so
its candidates obey them. Children are the draft's top candidates (chosen from the context alone, not drawn),
so verification treats each as a point mass: greedy decoding keeps plain greedy's tokens and sampling keeps the
target's distribution exactly (`acceptance.sample_accept_tree`).

With prompt lookup (`prompt_lookup_num_tokens=`), each row's looked-up continuation is grafted onto its tree
(`tree_growth.graft_lookup`, as for Medusa and EAGLE heads): where the text repeats, lookup's long matches cost
the draft nothing to propose. On the steps the speculation gate keeps plain (growing a tree does not pay: large
batches on small machines), the lookup's chain is still verified where its own rule finds it worth it
(`propose_free`); the draft then catches up on the committed tokens at its next tree, as after a plain step.

The draft's cache keeps, after each step, the committed tokens and the accepted path's nodes it was fed (moved
into path order); the path's nodes it was never fed (a leaf, grafted nodes) are fed at the next step with the
target's token. A draft with recurrent layers cannot take siblings side by side in a row: it grows its trees with
each frontier node a row of its own (`hf_specdec.drafters.recurrent_tree`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.drafters.draft_model import DraftModelDrafter
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.drafters.tree_growth import LookupWhileWaiting, graft_lookup, grow_tree, lookup_alone
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import Accepted, Proposal, chain_proposal, committed_tokens
from hf_specdec.generation.processing import RaggedLogitsProcessor, score_nodes
from hf_specdec.generation.readback import HostReads
from hf_specdec.generation.recurrent import has_recurrent_layers
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.masks import chain_structure

# A draft tree's shape when `tree=` gives only its size (`tree=16`): growing stops where a depth does not pay,
# so a deep limit costs nothing where the draft is unsure (Qwen2.5-Coder 1.5B/0.5B, batch 1: 16 nodes to depth 8
# ran 1.57x plain, 12 nodes to depth 6 1.54x, in one benchmark run).
DEFAULT_DEPTH = 8
DEFAULT_TOP_K = 2


def draft_tree_spec(tree: DynamicTree | int) -> DynamicTree:
    """The tree a draft model grows for `generate(assistant=..., tree=...)`: a `DynamicTree` (depth
    `DEFAULT_DEPTH` when unset), or a number of nodes."""
    if isinstance(tree, bool) or not isinstance(tree, (DynamicTree, int)):
        raise TypeError(
            f"With `assistant=`, `tree` is a hf_specdec.DynamicTree or a number of nodes, got {type(tree).__name__}."
        )
    if isinstance(tree, int):
        return DynamicTree.at_most(tree, DEFAULT_DEPTH, DEFAULT_TOP_K)
    if tree.depth is None:
        tree = dataclasses.replace(tree, depth=DEFAULT_DEPTH)
    return tree


class DraftTreeDrafter(DraftModelDrafter, LookupWhileWaiting):
    """Grows a tree per row with a draft model (see the module's docstring).

    Args:
        model, target_vocab_size, processors, do_sample, generator, token_ids: as for `DraftModelDrafter`.
        tree (`DynamicTree`): the tree to grow, with its depth set.
        schedule (`DraftLengthPolicy`, *optional*): with the adaptive schedule (the default) the tree grows and is
            verified only as far as it pays (`tree_growth.grow_tree`); otherwise whole.
        prompt_lookup (`PromptLookupDrafter`, *optional*): also graft each row's prompt-lookup continuation onto
            its tree, as far as the measured acceptance of its matches pays for verifying it.
    """

    feeds_frontier_as_rows: ClassVar[bool] = False  # a frontier's nodes fed side by side in one row each

    def __init__(
        self,
        model: PreTrainedModel,
        target_vocab_size: int,
        processors: RaggedLogitsProcessor,
        do_sample: bool,
        generator: torch.Generator | None = None,
        token_ids: torch.Tensor | None = None,
        *,
        tree: DynamicTree,
        schedule: DraftLengthPolicy | None = None,
        prompt_lookup: PromptLookupDrafter | None = None,
        reads: HostReads | None = None,
        generation_config: GenerationConfig | None = None,
    ) -> None:
        if tree.depth is None:
            raise ValueError("DraftTreeDrafter needs a DynamicTree with a depth (see `draft_tree_spec`).")
        if has_recurrent_layers(model) and not self.feeds_frontier_as_rows:  # siblings side by side in a row
            raise TypeError("A draft with recurrent layers grows its trees with `RecurrentDraftTreeDrafter`.")
        super().__init__(
            model,
            target_vocab_size,
            processors,
            do_sample,
            generator,
            token_ids,
            schedule=schedule,
            reads=reads,
            generation_config=generation_config,
        )
        self.tree, self.prompt_lookup = tree, prompt_lookup
        self.max_depth = max(tree.depth, prompt_lookup.num_tokens if prompt_lookup is not None else 0)
        self._fed_pool: torch.Tensor | None = None  # (A, F) pool index of every tree node fed this step
        self._chosen: torch.Tensor | None = None  # (A, n) pool index of every grown tree node after the root
        self._grafted = False  # whether this step's trees have looked-up nodes grafted on (never fed)
        self._frontiers: list[torch.Tensor] = []  # (A, F) pool indices of the nodes fed at each depth

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        super().prefill(input_ids, valid, positions)
        if self.prompt_lookup is not None:
            self.prompt_lookup.prefill(input_ids, valid, positions)

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        """Grow each row's tree from its last token, no deeper than `max_tokens` (at least one) nor than the
        draft's positions reach (once they are used up, or while starting the draft does not pay, prompt lookup's
        chain alone, or a plain step), and graft
        prompt lookup's continuation on."""
        room = self.room(next_position, costs, max_tokens)
        if room < 1:
            proposal = lookup_alone(self.prompt_lookup, last_token, buffer, next_position, costs, max_tokens)
            started = self.take_started()  # the draft's forward timed, not started
            if proposal is not None:
                return proposal._replace(started=started)
            return chain_proposal(
                last_token, last_token.new_zeros(len(last_token), 0), plain=self.declined, started=started
            )
        assert self.seq is not None and self.pending is not None and self.pending_count is not None
        spec = self.tree.within(min(max_tokens, room))
        target_device = buffer.tokens.device
        rows = buffer.active.shape[0]
        last_position = buffer.max_length - 1
        state = _Growth(rows, target_device)

        def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
            """The draft's processed log-probabilities after every frontier node `(A, F, V)`."""
            assert self.seq is not None
            if parent_slot is None:  # the root: feed what the draft has not seen yet, ending with the root
                ids, valid, positions = self._pending_inputs(next_position, last_position)
                structure = chain_structure(ids.shape[1], self.device)
                out = self.seq.forward(self._embeddable(ids), valid, positions, structure, 1)
                logits = self._logits(out).to(target_device)  # (A, 1, V)
            else:
                state.advance(tokens, parent_slot)
                positions = (next_position[:, None] - 1 + state.depth).clamp_max(last_position).to(self.device)
                logits = self._feed_frontier(state, tokens, parent_slot, positions).to(target_device)
            return state.log_probs(self.processors, buffer, logits)

        adaptive = costs if self.schedule.adaptive else None
        grown = grow_tree(spec, last_token, expand, lambda ids: ids, buffer, adaptive)
        nodes, trees, looked_up = graft_lookup(
            grown.nodes, grown.trees, self.prompt_lookup, buffer, next_position, costs, max_tokens
        )
        fed_pool = torch.cat([last_token.new_zeros(rows, 0), *grown.pool.frontiers[1:]], dim=1)  # fed after the root
        self._fed = self._pending_width + fed_pool.shape[1]
        self._fed_pool, self._chosen, self._grafted = fed_pool, grown.chosen, looked_up
        self._frontiers = grown.pool.frontiers[1:]
        # Statistics count a tree's drafted tokens by its depth, as for Medusa's trees (the most a step accepts).
        catch_up = self._pending_width > 2  # more than the step's own pending tokens (`Proposal.catch_up`)
        return Proposal(
            nodes, trees, forwards=grown.forwards, looked_up=looked_up, catch_up=catch_up, started=self.take_started()
        )

    def _feed_frontier(
        self, state: _Growth, tokens: torch.Tensor, parent_slot: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Feed a frontier `tokens` `(A, F)` (children of the previous frontier's `parent_slot` `(A, F)`, at
        `positions` `(A, 1)`) to the draft side by side, each under its ancestors: the logits after each `(A, F, V)`."""
        assert self.seq is not None
        out = self.seq.forward(
            self._embeddable(tokens.to(self.device)),
            state.alive.to(self.device),
            positions.expand_as(tokens),
            torch.eye(tokens.shape[1], dtype=torch.bool, device=self.device),
            0,
            recent=state.frontier_recent.to(self.device),
        )
        return self._all_logits(out)

    def commit(self, accepted: Accepted) -> None:
        """Keep what the draft was fed of the accepted path (`_keep_accepted`) and queue the rest. After a step that
        grew no tree (prompt lookup's chain alone, `propose_free`), queue every committed token, as after a plain
        step."""
        if self.prompt_lookup is not None:
            self.prompt_lookup.observe(committed_tokens(accepted))
        if self.exhausted:
            return
        if self._fed_pool is None:
            self.follow(accepted)
            return
        assert self.seq is not None and self._chosen is not None
        self._keep_accepted(accepted)
        self._fed_pool = None

    def _accepted_pool(self, path: torch.Tensor) -> torch.Tensor:
        """The pool index of every accepted node after the root `(A, D)` of an accepted `path` `(A, D+1)`: -1 past
        the path, and for grafted nodes (never in the pool)."""
        assert self._chosen is not None
        grown = self._chosen.shape[1]
        tree_nodes = path[:, 1:]  # (A, D)
        in_pool = (tree_nodes > 0) & (tree_nodes <= grown)
        return torch.where(in_pool, self._chosen.gather(1, (tree_nodes - 1).clamp(0, max(grown - 1, 0))), -1)

    def _keep_accepted(self, accepted: Accepted) -> None:
        """Keep the committed tokens and the fed nodes of the accepted path in the draft's cache, in path order;
        queue the path's nodes that were never fed, then the target's token."""
        assert self.seq is not None and self._fed_pool is not None
        path, num_accepted = accepted.path, accepted.num_accepted
        width = self._pending_width
        pool = self._accepted_pool(path)  # (A, D)
        fed = self._fed_pool.to(pool.device)  # (A, F)
        match = (pool[:, :, None] == fed[:, None, :]) & (pool[:, :, None] >= 0)  # (A, D, F)
        was_fed = match.any(dim=2)  # (A, D): a prefix of the path (a node's children are fed only if it was)
        slot = width + (match.to(torch.int8).argmax(dim=2) if match.shape[2] else torch.zeros_like(pool))  # (A, D)
        kept_nodes = was_fed.sum(dim=1)  # (A,)
        keep = torch.cat([torch.arange(width, device=path.device).expand(path.shape[0], width), slot], dim=1)
        # At most every accepted node was fed: a bound the host knows (rows that kept fewer get holes).
        most = self._fed if accepted.outcome is None else min(self._fed, width + accepted.outcome.max_accepted)
        self.seq.keep_path(self._fed, keep.to(self.device), (width + kept_nodes).to(self.device), keep_max=most)
        self.seq.maybe_compact()
        # The path's nodes never fed, then the target's token. Without grafted nodes only the path's last node can
        # be unfed (a leaf of the grown tree): at most two tokens.
        most = path.shape[1] if accepted.outcome is None else accepted.outcome.max_accepted + 1
        self._queue_unfed(accepted.tokens, kept_nodes, num_accepted, most if self._grafted else min(most, 2))

    def _queue_unfed(self, tokens: torch.Tensor, fed: torch.Tensor, num_accepted: torch.Tensor, most: int) -> None:
        """Queue row b's `tokens[b, fed[b] : num_accepted[b] + 1]` (its accepted tokens the draft was not fed,
        then the target's token) as pending, right-aligned; `most`: at least the longest, known to the host."""
        tokens, fed, num_accepted = tokens.to(self.device), fed.to(self.device), num_accepted.to(self.device)
        count = num_accepted + 1 - fed  # (A,)
        offset = torch.arange(most, device=self.device)[None, :] - (most - count)[:, None]  # (A, most)
        source = (fed[:, None] + offset).clamp(0, tokens.shape[1] - 1)
        self.pending = tokens.gather(1, source).masked_fill(offset < 0, 0)
        self.pending_count = count
        self._pending_most = most


class FrontierAncestry:
    """Which nodes fed to a drafter earlier in a step each node of the current frontier sees (its ancestors
    among them), for trees fed one depth per forward: `recent` `(A, F, S)` over the `S` nodes fed after the
    root (the root is fed with the committed tokens, which every node sees)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.depth = 0
        self.recent = torch.zeros(rows, 1, 0, dtype=torch.bool, device=device)

    def advance(self, parent_slot: torch.Tensor, previous_width: int) -> None:
        """The next frontier: node f is a child of the previous frontier's node `parent_slot[:, f]` `(A, F)`."""
        recent = self.recent.gather(1, parent_slot[..., None].expand(-1, -1, self.recent.shape[2]))
        if self.depth > 0:  # the parent itself was fed at the previous depth (unless it is the root)
            own = parent_slot[..., None] == torch.arange(previous_width, device=parent_slot.device)  # (A, F, F_prev)
            recent = torch.cat([recent, own], dim=2)
        self.recent = recent
        self.depth += 1


class _Growth:
    """The bookkeeping of one step's growth: for every frontier node, its ancestors among the nodes fed to the
    draft earlier in the step, its drafted tokens (the prefix its processors read), and whether it is still
    alive (not ruled out by the processors)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.rows, self.device = rows, device
        self.ancestry = FrontierAncestry(rows, device)
        self.paths = torch.zeros(rows, 1, 0, dtype=torch.long, device=device)  # (A, F, depth) tokens after root
        self.alive = torch.ones(rows, 1, dtype=torch.bool, device=device)  # (A, F)
        self.last_log_probs: torch.Tensor | None = None  # (A, F, V) of the previous frontier

    def advance(self, tokens: torch.Tensor, parent_slot: torch.Tensor) -> None:
        """The next frontier: `tokens` `(A, F)`, children of the previous frontier's nodes `parent_slot`."""
        assert self.last_log_probs is not None
        previous_width = self.last_log_probs.shape[1]
        rows = torch.arange(self.rows, device=self.device)[:, None]
        parent_logp = self.last_log_probs[rows, parent_slot].gather(2, tokens[..., None]).squeeze(2)  # (A, F)
        self.alive = self.alive.gather(1, parent_slot) & (parent_logp > float("-inf"))  # (nan: ruled out too)
        self.ancestry.advance(parent_slot, previous_width)
        self.paths = torch.cat(
            [self.paths.gather(1, parent_slot[..., None].expand(-1, -1, self.paths.shape[2])), tokens[..., None]],
            dim=2,
        )

    @property
    def depth(self) -> int:
        return self.ancestry.depth

    @property
    def frontier_recent(self) -> torch.Tensor:
        """`(A, F, S)`: which nodes fed earlier this step each frontier node sees."""
        return self.ancestry.recent

    def log_probs(self, processors: RaggedLogitsProcessor, buffer: TokenBuffer, logits: torch.Tensor) -> torch.Tensor:
        """Process the draft's logits after every frontier node `(A, F, V)` with the node's own prefix; nodes
        ruled out, and rows whose processors leave nothing, get -inf everywhere (their children are padding)."""
        width = logits.shape[1]
        lengths = buffer.active_lengths
        # Plain decoding scores nothing past the length limit, nor after an EOS: nodes there get no children.
        self.alive &= (lengths + self.depth < buffer.max_length)[:, None]
        if self.depth and buffer.eos is not None:
            self.alive &= ~torch.isin(self.paths[..., -1], buffer.eos)
        if processors.prefix_free:
            scores = processors(buffer, buffer.active, lengths, logits)  # prefix-free: positions do not matter
        elif processors.any_prefix:  # every node scored, none read back (ruled-out ones are masked below)
            depths = [[self.depth] * width] * logits.shape[0]
            scores = score_nodes(processors, buffer, self.paths, depths, logits)
        else:
            scores = logits.clone()
            for f in range(width):
                shown = self.alive[:, f].nonzero(as_tuple=True)[0]
                if shown.numel() == 0:
                    continue
                if self.depth:
                    buffer.write(0, self.paths[shown, f], rows=shown)
                scores[shown, f] = processors(
                    buffer, buffer.active[shown], lengths[shown] + self.depth, logits[shown, f][:, None]
                )[:, 0]
        self.last_log_probs = node_log_probs(scores, self.alive)
        return self.last_log_probs


def node_log_probs(scores: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """Log-probabilities `(A, F, V)` of frontier nodes' scores: a nan score is never proposed, a node ruled out
    (`alive` `(A, F)` False) or whose scores leave nothing gets -inf everywhere. Without reading anything back:
    the same operations for every node, odd or not."""
    scores = scores.masked_fill(~alive[..., None] | torch.isnan(scores), float("-inf"))
    none_left = ~(scores > float("-inf")).any(dim=-1, keepdim=True)
    return torch.log_softmax(scores.masked_fill(none_left, 0.0), dim=-1).masked_fill(none_left, float("-inf"))
