"""One pipeline for every drafter that proposes trees: a draft model's (`DraftTreeDrafter`), EAGLE heads'
(`EagleDrafter`), Medusa and recurrent heads' dynamic trees (`MedusaDrafter`).

A step's tree is grown depth by depth from the drafter's probabilities (`DynamicTree.grow_pool`), the nodes worth
verifying are chosen from what grew (`GrownPool.select`), and prompt lookup's continuation is grafted on
(`hf_specdec.trees.lookup_graft`). With adaptive decisions (`costs` given) growing stops at the first depth that
does not pay for its drafter forward (`decisions.growth_rule`), and only the best nodes that pay for their
verification are verified (`decisions.nodes_worth_verifying`); without, the tree is grown and verified whole. The
decisions are the same for every drafter; drafters differ only in how they expand a frontier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.generation.decisions import CostModel, growth_rule, nodes_worth_verifying
from hf_specdec.generation.drafter import Proposal, chain_proposal
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.trees.dynamic import DynamicTree, Expander, GrownPool
from hf_specdec.trees.row_trees import RowTrees


class GrownTree(NamedTuple):
    """A step's tree.

    Attributes:
        nodes (`torch.LongTensor` of shape `(A, N)`): every node's token, the root first.
        trees (`RowTrees`): their structure.
        pool (`GrownPool`): everything growing produced.
        chosen (`torch.LongTensor` of shape `(A, n)`): the pool index of every grown tree node after the root
            (nodes grafted after them are not in the pool).
    """

    nodes: torch.Tensor
    trees: RowTrees
    pool: GrownPool
    chosen: torch.Tensor

    @property
    def forwards(self) -> int:
        """Drafter forwards growing took: one per depth expanded."""
        return len(self.pool.frontiers)


def grow_tree(
    spec: DynamicTree,
    root: torch.Tensor,
    expand: Expander,
    to_token_ids: Callable[[torch.Tensor], torch.Tensor],
    buffer: TokenBuffer,
    costs: CostModel | None,
) -> GrownTree:
    """Grow every active row's tree from its root `(A,)` and choose the nodes to verify; `costs`: the loop's cost
    model, for adaptive growing and choosing (`None`: the whole tree)."""
    rows = root.shape[0]
    rule = None if costs is None else growth_rule(costs, buffer.lagging, rows)
    pool = spec.grow_pool(root, expand, to_token_ids, rule)
    num_nodes = spec.num_nodes
    if costs is not None:
        num_nodes = nodes_worth_verifying(pool.scores, num_nodes, buffer.lagging_rows(), costs.threshold(rows))
    nodes, trees, chosen = pool.select(num_nodes)
    return GrownTree(nodes, trees, pool, chosen)


def graft_lookup(
    nodes: torch.Tensor,
    trees: RowTrees,
    lookup: PromptLookupDrafter | None,
    buffer: TokenBuffer,
    next_position: torch.Tensor,
    costs: CostModel,
    max_tokens: int,
) -> tuple[torch.Tensor, RowTrees, bool]:
    """`(nodes, trees, looked_up)`: the trees with each row's prompt-lookup continuation grafted on, as far as the
    lookup drafts it (`PromptLookupDrafter.graft`); the trees as they are without a lookup."""
    if lookup is None:
        return nodes, trees, False
    return lookup.graft(nodes, trees, buffer, next_position, costs, max_tokens)


def lookup_alone(
    lookup: PromptLookupDrafter | None,
    last_token: torch.Tensor,
    buffer: TokenBuffer,
    next_position: torch.Tensor,
    costs: CostModel,
    max_tokens: int,
) -> Proposal | None:
    """Each row's prompt-lookup continuation alone, as a chain from its last token (`last_token` `(A,)`), drafted
    by the lookup's own rule (`PromptLookupDrafter.draft_chain`): a tree drafter's proposal on a step where its
    own drafting does not pay (`FreeProposals`) or cannot run. `None` where the lookup drafts nothing, and without
    a lookup."""
    if lookup is None:
        return None
    chain = lookup.draft_chain(buffer, next_position, costs, max_tokens)
    return chain_proposal(last_token, *chain) if chain.tokens.shape[1] else None


class LookupWhileWaiting:
    """`FreeProposals` for a tree drafter with an optional prompt lookup (`prompt_lookup`): on the steps the
    speculation gate keeps plain (its trees do not pay there; a lookup costs no drafter forward), the lookup's chain
    alone (`lookup_alone`)."""

    prompt_lookup: PromptLookupDrafter | None

    def propose_free(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal | None:
        """Prompt lookup's chain alone: `None` without a lookup, or where it drafts nothing."""
        return lookup_alone(self.prompt_lookup, last_token, buffer, next_position, costs, max_tokens)
