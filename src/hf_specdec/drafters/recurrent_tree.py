"""A draft model with recurrent layers growing a tree: each frontier node a row of the draft's batch.

A recurrent layer (linear attention, a state space model, a short convolution) reads the tokens of a forward in
order, each from the state the token before it left, so a frontier's siblings cannot be fed side by side in one
row as `DraftTreeDrafter` feeds an attention draft. Here each frontier node is a row of its own: before a depth's
forward, every node's row is a copy of its parent's (its caches and states, `CachedSequence.select_rows`), and
the forward feeds one token per row, a scan over depths from each parent's state batched over the nodes of a
depth. Growing, choosing and grafting are `DraftTreeDrafter`'s.

After verification each sequence keeps the row of a last-depth node whose path shares the most nodes with the
accepted path (the state after them, recorded per token as every recurrent draft's is), and queues the accepted
tokens past them, then the target's token, to be fed at the next step. When the accepted path leaves every row
(its nodes were pruned from the frontier before the last depth), those tokens are fed again: a wider first
forward at the next step, never a wrong state.

What it costs over an attention draft's tree: the draft's caches are copied once per depth for each frontier
node (one copy per row; linear-attention and state space states are small, the attention layers' caches are
the size of a sequence's), and each depth's forward runs `F` rows of one token instead of one row of `F`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from hf_specdec.drafters.draft_tree import DraftTreeDrafter, _Growth
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import Accepted, Proposal
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.trees.masks import chain_structure


class RecurrentDraftTreeDrafter(DraftTreeDrafter):
    """`DraftTreeDrafter` for a draft with recurrent layers: each frontier node fed as a row of its own (see the
    module's docstring). Same arguments."""

    feeds_frontier_as_rows: ClassVar[bool] = True

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        # Each row's frontier slot at every depth fed so far `(A, F, depths)`: the row's path through the frontiers.
        self._row_slots = torch.zeros(len(last_token), 1, 0, dtype=torch.long, device=last_token.device)
        return super().propose(buffer, last_token, next_position, costs, max_tokens)

    def _feed_frontier(
        self, state: _Growth, tokens: torch.Tensor, parent_slot: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Copy each frontier node's row from its parent's, then feed one token per row: the logits `(A, F, V)`."""
        assert self.seq is not None
        rows, width = tokens.shape
        previous = self._row_slots.shape[1]  # rows per sequence now: the previous frontier's (1: the root's)
        parent_rows = torch.arange(rows, device=parent_slot.device)[:, None] * previous + parent_slot  # (A, F)
        self.seq.select_rows(parent_rows.reshape(-1).to(self.device))
        slots = self._row_slots.gather(1, parent_slot[..., None].expand(-1, -1, self._row_slots.shape[2]))
        own = torch.arange(width, device=parent_slot.device).expand(rows, width)
        self._row_slots = torch.cat([slots, own[..., None]], dim=2)
        out = self.seq.forward(
            self._embeddable(tokens.reshape(-1, 1).to(self.device)),
            state.alive.reshape(-1, 1).to(self.device),
            positions.expand_as(tokens).reshape(-1, 1),
            chain_structure(1, self.device),
            0,
        )
        return self._all_logits(out).reshape(rows, width, -1)

    def _keep_accepted(self, accepted: Accepted) -> None:
        """Keep, per sequence, the row of a last-depth node sharing the most nodes with the accepted path, with the
        state after those nodes; queue the accepted tokens past them, then the target's token."""
        assert self.seq is not None
        path, num_accepted = accepted.path, accepted.num_accepted
        rows, width, depths = path.shape[0], self._pending_width, len(self._frontiers)
        shared = torch.zeros(rows, dtype=torch.long, device=path.device)
        if depths:
            pool = self._accepted_pool(path)[:, :depths]  # (A, m), -1 past the path and for grafted nodes
            slots = self._row_slots.to(path.device)  # (A, F, depths)
            lineage = torch.stack(
                [frontier.to(path.device).gather(1, slots[:, :, d]) for d, frontier in enumerate(self._frontiers)],
                dim=2,
            )[:, :, : pool.shape[1]]  # (A, F, m): the pool index of each row's node at every depth
            same = (lineage == pool[:, None, :]) & (pool[:, None, :] >= 0)
            shared, best = same.long().cumprod(dim=2).sum(dim=2).max(dim=1)  # (A,): nodes the best row shares
            self.seq.join((torch.arange(rows, device=path.device) * lineage.shape[1] + best).to(self.device))
        most = depths if accepted.outcome is None else min(depths, accepted.outcome.max_accepted)
        self.seq.keep_prefix(width + depths, (width + shared).to(self.device), keep_max=width + most)
        self.seq.maybe_compact()
        bound = path.shape[1] if accepted.outcome is None else accepted.outcome.max_accepted + 1
        self._queue_unfed(accepted.tokens, shared, num_accepted, bound)
