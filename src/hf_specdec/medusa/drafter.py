"""Medusa heads as a drafter: each step a tree of the heads' candidates per row (the same tree every step, or
one grown per row from the heads' probabilities), with prompt lookup's continuation grafted on when asked."""

from __future__ import annotations

import torch

from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.drafters.tree_growth import LookupWhileWaiting, graft_lookup, grow_tree
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import Accepted, DraftingContext, Proposal, committed_tokens
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.medusa.heads import DraftHeads
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.static import DraftTree


class MedusaDrafter(LookupWhileWaiting):
    """Proposes the heads' candidates as a tree per row, read off the base's last hidden state.

    Children are the heads' top-ranked tokens (or, grafted, prompt lookup's), chosen from the committed context
    alone: each a point mass, so verification needs no q.

    Args:
        context (`DraftingContext`): the loop's context (the base model's lm_head and embeddings are read).
        heads (`DraftHeads`): Medusa's or recurrent heads on the base's last hidden state.
        tree (`DraftTree` or `DynamicTree`): the same tree every step, or one grown per row and step (with a
            depth set).
        prompt_lookup (`PromptLookupDrafter`, *optional*): also graft each row's prompt-lookup continuation onto
            its tree (`hf_specdec.trees.lookup_graft`), as far as the measured acceptance of its matches pays for
            verifying it.
        adaptive (`bool`): grow and verify a dynamic tree only as far as it pays (`tree_growth.grow_tree`);
            otherwise whole (a static tree is always verified whole).
    """

    hidden_state_layers = (-1,)

    def __init__(
        self,
        context: DraftingContext,
        heads: DraftHeads,
        tree: DraftTree | DynamicTree,
        prompt_lookup: PromptLookupDrafter | None = None,
        adaptive: bool = True,
    ) -> None:
        if isinstance(tree, DynamicTree) and tree.depth is None:
            raise ValueError("MedusaDrafter needs a DynamicTree with a depth (generate() sets the heads' own).")
        self.heads = heads
        self.tree = tree
        self.prompt_lookup = prompt_lookup
        self.adaptive = adaptive
        self.lm_head = context.target.get_output_embeddings()
        self.embeddings = context.target.get_input_embeddings()
        device = context.target.device
        self.static = tree.row_trees(device) if isinstance(tree, DraftTree) else None
        self.max_depth = max(tree.depth, prompt_lookup.num_tokens if prompt_lookup is not None else 0)
        # A chain (the top candidate of every head), nothing grafted: every row's path is a prefix of its nodes, which
        # a target verifies as a chain (in place on a target with recurrent layers, not path by path).
        chain = tree.is_chain if isinstance(tree, DraftTree) else tree.top_k == 1
        self.chain = chain and prompt_lookup is None
        self.hidden: torch.Tensor | None = None  # (A, 1, H) the base's state that chose each row's last token

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        if self.prompt_lookup is not None:
            self.prompt_lookup.prefill(input_ids, valid, positions)

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None) -> None:
        assert hidden is not None
        self.hidden = hidden[:, -1:]

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        """The heads' candidates after each row's last token (the root), with lookup's chain grafted on."""
        assert self.hidden is not None
        hidden = self.hidden[:, -1]
        if self.static is not None:
            assert isinstance(self.tree, DraftTree)
            nodes = self.heads.tree_candidates(hidden, last_token, self.tree, self.lm_head, self.embeddings)
            trees = self.static.expand(nodes.shape[0])
        else:
            assert isinstance(self.tree, DynamicTree)
            spec = self.tree.within(max_tokens)  # no deeper than the step can commit (nor its token buffer hold)
            expand = self.heads.expander(hidden, self.lm_head, self.embeddings)
            grown = grow_tree(
                spec, last_token, expand, self.heads.to_token_ids, buffer, costs if self.adaptive else None
            )
            nodes, trees = grown.nodes, grown.trees
        nodes, trees, looked_up = graft_lookup(
            nodes, trees, self.prompt_lookup, buffer, next_position, costs, max_tokens
        )
        return Proposal(nodes, trees, looked_up=looked_up, chain=self.chain)  # drafted: trees' depths

    def commit(self, accepted: Accepted) -> None:
        """Keep the base's state at the last accepted node (the heads read it next), and let prompt lookup learn
        what its matches would have committed."""
        self.hidden = _last_accepted(accepted)
        if self.prompt_lookup is not None:
            self.prompt_lookup.observe(committed_tokens(accepted))

    def follow(self, accepted: Accepted) -> None:
        """A plain step: the heads read the base's state at the target's new token next."""
        self.hidden = _last_accepted(accepted)

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.hidden is not None
        self.hidden = self.hidden[keep]
        if self.prompt_lookup is not None:
            self.prompt_lookup.select_rows(keep)


def _last_accepted(accepted: Accepted) -> torch.Tensor:
    """The base's hidden state at each row's last accepted node `(A, 1, H)`: the one that chose its next token."""
    assert accepted.hidden is not None
    index = accepted.num_accepted[:, None, None].expand(-1, 1, accepted.hidden.shape[-1])
    return accepted.hidden.gather(1, index)
