"""Expected tokens and speedup of a verification tree, and the best tree of a given size.

A tree is a list of paths in Medusa's "choices" format: `[[0], [0, 0], [1], [0, 1]]` has four nodes; a
node's path lists, for each depth from 1, the rank of the candidate taken at that depth (0 = the drafter's
most likely token). A chain of gamma drafts is `[[0], [0, 0], ..., [0] * gamma]`.

Acceptance is described per depth and rank (Medusa's model, Cai et al. 2024, section 3.1.2):
`accept_probs[d][r]` is the probability that the target's token at depth d + 1 is the rank-r candidate,
given that the node's parent was accepted. At one depth the ranks are mutually exclusive events (the
target picks one token), so each row sums to at most 1. A node is accepted when every node on its path
is, so

    tau = 1 + sum over nodes of prod_{d} accept_probs[d][path[d]]

(the 1 is the token the target always adds), and a step costs depth * c (one draft forward per level)
plus V(nodes + 1) for verifying every node and the root in one forward. A node's probability and the best tree
are the library's own (`path_probability` and `best_paths` of `hf_specdec.trees.static`, which plan Medusa trees).
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_specdec.simulator.closed_form import step_cost
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.validation import check_probabilities
from hf_specdec.trees.static import best_paths, path_probability

Tree = tuple[tuple[int, ...], ...]
"""Paths from the root, each a tuple of candidate ranks, one per depth."""


def check_tree(paths: Sequence[Sequence[int]]) -> Tree:
    """Return `paths` as a `Tree`, or raise `ValueError` unless they form a tree.

    Every path must be non-empty, made of ranks >= 0, listed once, and its parent (the path without its
    last rank) must be listed too (the root, the empty path, is implicit).
    """
    tree = tuple(tuple(int(r) for r in path) for path in paths)
    if not tree:
        raise ValueError("A tree needs at least one path, e.g. [[0]] for a single drafted token.")
    nodes = set(tree)
    if len(nodes) != len(tree):
        raise ValueError("A tree lists each path once; remove the duplicates.")
    for path in tree:
        if not path or min(path) < 0:
            raise ValueError(f"Each path is a non-empty list of ranks >= 0, got {list(path)}.")
        if len(path) > 1 and path[:-1] not in nodes:
            raise ValueError(f"Path {list(path)} has no parent: add {list(path[:-1])} to the tree.")
    return tree


def check_accept_probs(accept_probs: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """Return per-depth, per-rank acceptance probabilities, or raise `ValueError` unless each is in [0, 1]
    and each depth's ranks sum to at most 1."""
    table = tuple(check_probabilities(f"accept_probs[{d}]", row) for d, row in enumerate(accept_probs))
    for d, row in enumerate(table):
        if sum(row) > 1.0 + 1e-9:
            raise ValueError(
                f"accept_probs[{d}] sums to {sum(row):.4f} > 1: the ranks at one depth are mutually exclusive "
                "(the target picks one token), so their probabilities must sum to at most 1."
            )
    return table


def chain_tree(gamma: int) -> Tree:
    """The tree of a chain of `gamma` drafts: `[[0], [0, 0], ...]`."""
    return tuple((0,) * depth for depth in range(1, gamma + 1))


def tree_capacity(accept_probs: Sequence[Sequence[float]]) -> int:
    """The most nodes a tree can have with these depths and ranks (the full tree)."""
    capacity, level = 0, 1
    for row in accept_probs:  # the full tree has prod(ranks at depths <= d) nodes at depth d
        level *= len(row)
        capacity += level
    return capacity


def tree_depth(paths: Sequence[Sequence[int]]) -> int:
    """The number of draft levels, i.e. draft forwards a draft model needs to build the tree."""
    return max(len(path) for path in check_tree(paths))


def node_probabilities(paths: Sequence[Sequence[int]], accept_probs: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """P(node accepted) for every node of the tree, in the order of `paths`."""
    tree, table = check_tree(paths), check_accept_probs(accept_probs)
    probs = []
    for path in tree:
        if len(path) > len(table) or any(rank >= len(table[d]) for d, rank in enumerate(path)):
            raise ValueError(
                f"Path {list(path)} goes beyond accept_probs (depths {len(table)}, ranks per depth "
                f"{[len(row) for row in table]}); give a probability for every depth and rank the tree uses."
            )
        probs.append(path_probability(path, table))
    return tuple(probs)


def tree_expected_tokens(paths: Sequence[Sequence[int]], accept_probs: Sequence[Sequence[float]]) -> float:
    """Expected tokens per target forward with this verification tree: 1 + the expected accepted length."""
    return 1.0 + sum(node_probabilities(paths, accept_probs))


def tree_expected_speedup(
    paths: Sequence[Sequence[int]],
    accept_probs: Sequence[Sequence[float]],
    cost_ratio: float,
    verify_cost: CostCurve | None = None,
) -> float:
    """Expected speedup over plain decoding with this tree: tau / (depth * c + V(nodes + 1)).

    Args:
        paths (sequence of sequences of `int`): the tree, in Medusa's choices format.
        accept_probs (sequence of sequences of `float`): `[depth][rank]` acceptance probabilities.
        cost_ratio (`float`): one draft forward's cost in target forwards (a draft model drafts one level per
            forward; for heads on the target's hidden states pass their whole cost divided by the depth).
        verify_cost (`CostCurve`, *optional*): V(n); `None` is flat.
    """
    tau = tree_expected_tokens(paths, accept_probs)
    return tau / step_cost(len(paths), cost_ratio, verify_cost, draft_forwards=tree_depth(paths))


def best_tree(accept_probs: Sequence[Sequence[float]], num_nodes: int) -> Tree:
    """The tree of `num_nodes` nodes with the largest expected tokens (Medusa's "optimal sparse tree").

    A node's acceptance probability never exceeds its parent's, so taking the `num_nodes` most probable
    nodes, best first from the root's children, always gives a tree, and no tree of that size does better.

    Returns:
        `Tree` ordered from the most to the least probable node (ties broken by the paths' lexicographic order);
        fewer nodes only when `accept_probs` allows fewer (depths x ranks).
    """
    table = check_accept_probs(accept_probs)
    if num_nodes < 1:
        raise ValueError(f"A tree needs at least one node, got num_nodes={num_nodes!r}.")
    return tuple(best_paths(table, num_nodes))  # the library's own construction (hf_specdec.trees.static)
