"""A tree of drafted tokens, as data.

A tree is given as a list of paths in the Medusa "choices" format: `[0, 1]` is the node reached by taking
the top-1 candidate at depth 1, then the top-2 candidate at depth 2 (ranks count from 0). Every prefix of a
path must be a path too. The root (depth 0) is implicit: it is the token the target chose last, which the
verification forward feeds first.

`DraftTree` turns the paths into the tensors verification needs, once:

    parents     (N+1,)        parent of every node (the root is node 0, its parent -1)
    depths      (N+1,)        depth of every node; position id offset from the root
    ranks       (N+1,)        candidate rank of every node at its depth (the root: 0)
    ancestors   (N+1, N+1)    ancestors[i, j]: node j is node i or one of its ancestors (the attention mask)
    paths       (L, D+1)      every root-to-leaf path as node indices, padded with -1 after the leaf
    children    (N+1, C)      every node's children by rank, padded with -1
A chain of k drafts is the tree `[[0], [0, 0], ...]` with one child per node.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hf_specdec.trees.row_trees import RowTrees


@dataclass(frozen=True)
class DraftTree:
    """An immutable draft tree built from Medusa-style choices (paths of candidate ranks).

    Args:
        choices (`list[list[int]]` or tuple): the paths, in any order; duplicates are refused.
    """

    choices: tuple[tuple[int, ...], ...]
    parents: torch.Tensor = field(init=False, repr=False, compare=False)
    depths: torch.Tensor = field(init=False, repr=False, compare=False)
    ranks: torch.Tensor = field(init=False, repr=False, compare=False)
    ancestors: torch.Tensor = field(init=False, repr=False, compare=False)
    paths: torch.Tensor = field(init=False, repr=False, compare=False)
    children: torch.Tensor = field(init=False, repr=False, compare=False)
    _structure: RowTrees = field(init=False, repr=False, compare=False)

    def __init__(self, choices: list[list[int]] | tuple[tuple[int, ...], ...]) -> None:
        normalized = _validate(choices)
        # Breadth-first order (by depth, then lexicographic): parents come before children.
        ordered = tuple(sorted(normalized, key=lambda path: (len(path), path)))
        object.__setattr__(self, "choices", ordered)
        index = {path: i + 1 for i, path in enumerate(ordered)}  # node 0 is the root
        parents = [-1] + [index.get(path[:-1], 0) for path in ordered]
        depths = [0] + [len(path) for path in ordered]
        ranks = [0] + [path[-1] for path in ordered]
        # The structure verification needs, computed as for any per-row tree (one row here), with the sizes known
        # here so that nothing is read back.
        structure = RowTrees.from_parents(
            torch.tensor([parents]), validate=False, max_depth=max(depths), max_children=_most_children(parents)
        )
        leaves = sorted(set(range(len(parents))) - set(parents))
        object.__setattr__(self, "_structure", structure)
        object.__setattr__(self, "parents", torch.tensor(parents))
        object.__setattr__(self, "depths", torch.tensor(depths))
        object.__setattr__(self, "ranks", torch.tensor(ranks))
        object.__setattr__(self, "ancestors", structure.ancestors[0])
        object.__setattr__(self, "paths", structure.paths[0][torch.tensor(leaves)])  # leaves in node order
        object.__setattr__(self, "children", structure.children[0])  # siblings in rank order: nodes are sorted

    @classmethod
    def chain(cls, length: int) -> DraftTree:
        """A chain of `length` drafts: one child per node, always the top candidate."""
        if length < 1:
            raise ValueError(f"A chain needs at least one draft, got {length}.")
        return cls([[0] * d for d in range(1, length + 1)])

    def row_trees(self, device: torch.device | str = "cpu") -> RowTrees:
        """This tree's structure as verification needs it, with a batch dimension of one (see
        [`RowTrees.expand`])."""
        return RowTrees(*(t.to(device) for t in self._structure._tensors()))

    @property
    def is_chain(self) -> bool:
        """Whether every node has one child at most (a chain, numbered in order)."""
        return self.num_nodes == self.depth + 1

    @property
    def num_nodes(self) -> int:
        """Nodes including the root: the number of tokens one verification forward feeds."""
        return self.parents.numel()

    @property
    def depth(self) -> int:
        """The longest path's number of drafted tokens."""
        return max(len(path) for path in self.choices)

    def top_k_per_depth(self) -> list[int]:
        """How many candidates each depth needs: 1 + the highest rank used there."""
        needed = [0] * self.depth
        for path in self.choices:
            needed[len(path) - 1] = max(needed[len(path) - 1], path[-1] + 1)
        return needed


def _validate(choices: list[list[int]] | tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
    if len(choices) == 0:
        raise ValueError("A draft tree needs at least one path, e.g. [[0]].")
    paths = []
    for choice in choices:
        path = tuple(choice)
        if not path or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in path):
            raise ValueError(f"Each tree path is a non-empty list of candidate ranks >= 0; got {list(choice)!r}.")
        paths.append(path)
    if len(set(paths)) != len(paths):
        raise ValueError("The tree lists a path more than once.")
    present = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in present:
            raise ValueError(f"Tree path {list(path)} has no parent {list(path[:-1])}: every prefix must be a path.")
    return paths


def build_tree(accuracies: list[list[float]], num_nodes: int) -> DraftTree:
    """The tree that maximises the expected number of accepted tokens for a node budget (Medusa's greedy
    construction).

    `accuracies[d][r]` is the probability that the rank-r candidate at depth d + 1 is the right token
    (for Medusa, head d's top-(r+1) accuracy minus its top-r accuracy). Taking candidates at different depths
    as independent, a node is accepted with the product of the accuracies along its path, and the expected
    accepted length is the sum of that over all nodes. A child is never likelier than its parent, so the
    `num_nodes` likeliest paths always form a valid tree, and a greedy pick of the likeliest frontier node is
    optimal.

    Args:
        accuracies (`list[list[float]]`): per depth, per rank, in [0, 1].
        num_nodes (`int`): drafted nodes (the root not counted).

    Returns:
        `DraftTree` with `num_nodes` nodes (fewer if the accuracies allow no more).
    """
    if num_nodes < 1:
        raise ValueError(f"A tree needs at least one node, got num_nodes={num_nodes}.")
    if any(not 0.0 <= a <= 1.0 for row in accuracies for a in row) or not accuracies:
        raise ValueError("accuracies must be a non-empty list of per-depth lists of probabilities in [0, 1].")
    return DraftTree([list(p) for p in best_paths(accuracies, num_nodes)])


def best_paths(accuracies: Sequence[Sequence[float]], num_nodes: int) -> list[tuple[int, ...]]:
    """The paths of the best tree of `num_nodes` nodes for `accuracies` (see [`build_tree`]), most likely first,
    ties in the paths' lexicographic order; fewer when the accuracies allow no more (depths x ranks).

    A greedy pick of the likeliest frontier node, starting from the root's children: a child is never likelier
    than its parent, so the `num_nodes` likeliest paths form a tree, and no tree of that size does better. The
    simulator's `best_tree` is this too.
    """
    frontier = [(-a, (r,)) for r, a in enumerate(accuracies[0])] if accuracies else []
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < num_nodes:
        neg_probability, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < len(accuracies):
            for r, a in enumerate(accuracies[len(path)]):
                heapq.heappush(frontier, (neg_probability * a, (*path, r)))
    return chosen


def path_probability(path: Sequence[int], accuracies: Sequence[Sequence[float]]) -> float:
    """The probability that the node at `path` is accepted: the product of the accuracies along the path (every
    node from the root to it must be right), 0 for a rank beyond those `accuracies` give."""
    probability = 1.0
    for depth, rank in enumerate(path):
        probability *= accuracies[depth][rank] if rank < len(accuracies[depth]) else 0.0
    return probability


def expected_accepted_length(tree: DraftTree, accuracies: list[list[float]]) -> float:
    """Expected drafted tokens accepted per step under the same independence model as [`build_tree`]: the sum
    of [`path_probability`] over the tree's nodes."""
    total = 0.0
    for path in tree.choices:
        total += path_probability(path, accuracies)
    return total


# Accuracies by depth and rank typical of trained Medusa-1 heads (top-1 about 0.6, 0.4, 0.3, 0.2, 0.15, the
# next ranks adding less and less); the presets are the best trees for them.
_TYPICAL_TOP1 = (0.6, 0.4, 0.3, 0.2, 0.15)
PRESET_SIZES = {"small": 8, "medium": 16, "large": 32, "xlarge": 64}


def preset_tree(name: str, num_heads: int) -> DraftTree:
    """A preset tree (`"small"`, `"medium"`, `"large"`, `"xlarge"`: 8 to 64 nodes) no deeper than `num_heads`,
    or `"chain"`: the top candidate of every head."""
    if name == "chain":
        return DraftTree.chain(num_heads)
    if name not in PRESET_SIZES:
        raise ValueError(f"Unknown tree preset {name!r}; choose from {['chain', *PRESET_SIZES]}.")
    return build_tree(typical_accuracies(num_heads), PRESET_SIZES[name])


def typical_accuracies(num_heads: int) -> list[list[float]]:
    """Per-rank accuracies of typical trained heads (the presets' model), for at most as many heads as known."""
    depth = min(num_heads, len(_TYPICAL_TOP1))
    return [[top1 * 0.45**rank for rank in range(8)] for top1 in _TYPICAL_TOP1[:depth]]


def _most_children(parents: list[int]) -> int:
    """The most children any node of a tree given by its parent pointers has (at least one)."""
    return max(Counter(parents[1:]).values(), default=1)
