"""Dynamic draft trees: grown at every step from the drafter's own probabilities (after EAGLE-2, Li et al.
2024).

A static tree spends its nodes where the heads are right *on average*; a dynamic tree spends them where the
drafter is confident *now*: a long chain through boilerplate, a wide fan where the next word is open. A
node's score is the drafter's probability of its whole path (the product of its own probabilities along the
path, a sum of log-probabilities), the drafter's estimate of the chance that verification accepts it.

Growing, depth by depth: every node of the frontier gets its `top_k` likeliest children; the `top_k` best
scored of those become the next frontier. Then the `num_nodes` best-scored nodes of everything grown form
the tree. A child's score never exceeds its parent's, and ties go to the node grown first (the parent), so
the chosen nodes always form a tree. Children of a node are the drafter's top candidates after its path:
distinct tokens, chosen without looking at the target, so the tree acceptance rules stay exact.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hf_specdec.trees.row_trees import RowTrees

# expand(tokens (B, F), parent_slot (B, F) or None) -> log-probabilities (B, F, V) of the next token after each
# frontier node; parent_slot[b, f]: which node of the previous frontier is the parent of frontier node f
# (None at the first depth, whose frontier is the root).
Expander = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
# keep_growing(previous_scores (B, F), frontier_scores (B, F')) -> whether to expand the new frontier (one more
# depth); the scores are the frontiers' path log-probabilities, the previous one's and the one just chosen.
GrowthRule = Callable[[torch.Tensor, torch.Tensor], bool]


@dataclass(frozen=True)
class DynamicTree:
    """A tree grown per row and per step from the drafter's probabilities.

    Pass it as `tree=` to `generate(assistant=draft, ...)` (a draft model grows it), to
    `generate(use_mtp=True, ...)` (the model's first multi-token-prediction layer grows it) or to
    `MedusaForCausalLM.generate(medusa=True, ...)` (the heads grow it).

    Defaults by drafter. `DynamicTree()` itself means 8 nodes and `top_k=4` for every drafter; its `depth`, left
    unset, is set by the drafter that grows it:

    - a draft model (`assistant=`): at most 8 deep. `tree=<int>` there is that many nodes grown at most 8
      deep with `top_k=2`;
    - the model's MTP layers (`use_mtp=True`): at most 4 deep; `tree=<int>`: that many nodes, 4 deep, `top_k=4`;
    - Medusa and recurrent heads: `num_heads` deep (as deep as the heads were trained to draft);
      `tree="dynamic"` is `DynamicTree()`, while `tree=<int>` and no `tree=` give static trees there
      (`DraftTree`). Medusa heads cannot draft deeper than `num_heads`; recurrent heads can;
    - EAGLE and EAGLE-3 heads, which always grow their trees: `num_heads` deep, and deeper when asked.
      `tree=<int>` is that many nodes with `top_k=4`; no `tree=` or `tree="dynamic"` is 16 nodes with
      `top_k=4` (not `DynamicTree()`'s 8).

    A `tree=<int>` of more nodes than its depth and `top_k` can grow is cut to `max_nodes`; a `DynamicTree` of
    more `num_nodes` than that is refused. With the adaptive schedule (`num_assistant_tokens_schedule="adaptive"`,
    the default) growing stops early where one more depth does not pay, so `depth` is a limit; `"constant"` grows
    and verifies the whole tree at every step.

    Args:
        num_nodes (`int`): drafted nodes verified per step, the root not counted (unlike `DraftTree.num_nodes`,
            which counts it): the verification cost. At most `max_nodes`, what `depth` and `top_k` can grow.
        depth (`int`, *optional*): how deep the tree may grow (the most drafted tokens a step can accept);
            default: set by the drafter (above).
        top_k (`int`): children per expanded node, and nodes expanded per depth.
    """

    num_nodes: int = 8
    depth: int | None = None
    top_k: int = 4

    def __post_init__(self) -> None:
        for name in ("num_nodes", "depth", "top_k"):
            value = getattr(self, name)
            if name == "depth" and value is None:
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DynamicTree.{name} must be a positive int, got {value!r}.")
            object.__setattr__(self, name, int(value))
        if self.depth is not None and self.num_nodes > self.max_nodes:
            raise ValueError(
                f"DynamicTree(num_nodes={self.num_nodes}, depth={self.depth}, top_k={self.top_k}) can grow at most "
                f"{self.max_nodes} nodes: lower num_nodes, or raise depth or top_k."
            )

    @property
    def max_nodes(self) -> int:
        """The most nodes growing can produce: `top_k` at the first depth, `top_k ** 2` at each further one."""
        if self.depth is None:
            raise ValueError("A DynamicTree without a depth has no size limit yet.")
        return self.top_k + (self.depth - 1) * self.top_k**2

    @classmethod
    def at_most(cls, num_nodes: int, depth: int, top_k: int) -> DynamicTree:
        """A tree of `num_nodes` nodes, or of as many as `depth` and `top_k` can grow when that is fewer."""
        return cls(num_nodes=min(num_nodes, top_k + (depth - 1) * top_k**2), depth=depth, top_k=top_k)

    def within(self, max_tokens: int) -> DynamicTree:
        """This tree (with its depth set) no deeper than `max_tokens` (at least one): the room a step has left."""
        if self.depth is None:
            raise ValueError("Give the DynamicTree a depth before cutting it.")
        depth = max(1, min(self.depth, max_tokens))
        return self if depth == self.depth else DynamicTree.at_most(self.num_nodes, depth, self.top_k)

    def grow(
        self, root: torch.Tensor, expand: Expander, to_token_ids: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, RowTrees]:
        """Grow every row's tree.

        Args:
            root (`torch.LongTensor` of shape `(batch,)`): the base's next token, the root of every tree.
            expand (`Expander`): the drafter's next-token log-probabilities after frontier nodes.
            to_token_ids: maps positions in the drafter's logits to token ids (a draft vocabulary).

        Returns:
            `(nodes, trees)`: the token of every node `(batch, num_nodes + 1)`, the root first, and the trees.
        """
        grown = self.grow_pool(root, expand, to_token_ids)
        nodes, trees, _ = grown.select(self.num_nodes)
        return nodes, trees

    def grow_pool(
        self,
        root: torch.Tensor,
        expand: Expander,
        to_token_ids: Callable[[torch.Tensor], torch.Tensor],
        keep_growing: GrowthRule | None = None,
    ) -> GrownPool:
        """Every node growing produces, before the best `num_nodes` are chosen (see `grow`); `keep_growing`, when
        given, may stop growing before `depth` (a drafter that pays for every depth it expands)."""
        if self.depth is None:
            raise ValueError("Give the DynamicTree a depth (generate() sets it to the heads' own depth).")
        batch = root.shape[0]
        tokens, parents, scores = [root[:, None]], [root.new_full((batch, 1), -1)], [root.new_zeros(batch, 1).float()]
        frontier = root.new_zeros(batch, 1)  # pool indices of the nodes to expand
        frontiers = [frontier]
        frontier_tokens, frontier_scores = root[:, None], scores[0]
        parent_slot: torch.Tensor | None = None
        size = 1
        for level in range(self.depth):
            logp = expand(frontier_tokens, parent_slot).float()  # (B, F, V)
            k = min(self.top_k, logp.shape[-1])
            top_logp, top = logp.topk(k, dim=-1)  # (B, F, k), best first
            child_scores = (frontier_scores[..., None] + top_logp).flatten(1)  # (B, F*k)
            child_tokens = to_token_ids(top).flatten(1)
            tokens.append(child_tokens)
            parents.append(frontier[..., None].expand(-1, -1, k).flatten(1))
            scores.append(child_scores)
            if level + 1 == self.depth:
                break
            best = child_scores.topk(min(self.top_k, child_scores.shape[1]), dim=1).indices  # (B, F')
            previous_scores = frontier_scores
            frontier_scores = child_scores.gather(1, best)
            if keep_growing is not None and not keep_growing(previous_scores, frontier_scores):
                break
            parent_slot = best // k
            frontier, frontier_tokens = size + best, child_tokens.gather(1, best)
            frontiers.append(frontier)
            size += child_scores.shape[1]
        branching = min(self.top_k, logp.shape[-1])
        return GrownPool(torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(scores, 1), frontiers, branching)


@dataclass(frozen=True)
class GrownPool:
    """Every node a dynamic tree grew, indexed in growing order (the root is 0, a parent before its children).

    Attributes:
        tokens, parents, scores (`(batch, pool)`): each node's token, parent (pool index, -1 for the root) and
            score (the log-probability of its path; -inf where the drafter ruled the node out).
        frontiers (`list` of `(batch, F)`): the pool indices of the nodes expanded at each depth, the root first.
        branching (`int`): the most children growing gave any node.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor
    frontiers: list[torch.Tensor]
    branching: int

    def select(self, num_nodes: int) -> tuple[torch.Tensor, RowTrees, torch.Tensor]:
        """The tree of the `num_nodes` best-scored nodes: `(nodes, trees, chosen)`, the token of every node
        `(batch, num_nodes + 1)` (the root first), the trees, and the pool index of every tree node after the
        root `(batch, num_nodes)`. Nodes scored -inf (ruled out) are padding: never tried, never accepted."""
        batch, size = self.tokens.shape
        device = self.tokens.device
        # The best-scored nodes; a stable sort puts a parent before a child of equal score.
        order = torch.sort(self.scores[:, 1:], dim=1, descending=True, stable=True).indices + 1
        chosen = order[:, :num_nodes].sort(dim=1).values  # (B, n): pool order, so parents come first
        renumber = torch.zeros(batch, size, dtype=torch.long, device=device)  # pool index -> tree node
        renumber.scatter_(1, chosen, torch.arange(1, chosen.shape[1] + 1, device=device).expand_as(chosen))
        tree_parents = renumber.gather(1, self.parents.gather(1, chosen))
        nodes = torch.cat([self.tokens[:, :1], self.tokens.gather(1, chosen)], dim=1)
        tree_parents = torch.cat([self.tokens.new_full((batch, 1), -1), tree_parents], dim=1)
        ruled_out = torch.isneginf(self.scores.gather(1, chosen))  # (B, n)
        real = torch.cat([torch.ones_like(ruled_out[:, :1]), ~ruled_out], dim=1)
        tree_parents = torch.where(real, tree_parents, 0)  # padding hangs from the root
        # Grown depth by depth with at most `branching` children per node, and no deeper than its nodes are many:
        # the sizes are known to the host.
        depth = min(len(self.frontiers), chosen.shape[1])
        trees = RowTrees.from_parents(
            tree_parents, real=real, validate=False, max_depth=depth, max_children=self.branching
        )
        return nodes, trees, chosen
