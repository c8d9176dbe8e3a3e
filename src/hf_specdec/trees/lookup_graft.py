"""Prompt lookup inside a tree: graft each row's looked-up continuation onto its tree.

Draft heads and draft models guess from what they have learned; prompt lookup (see `hf_specdec.drafters.lookup`)
copies what followed the row's last n-gram the last time it occurred. They are right in different places (a reply
that quotes its prompt, code that restates a signature, a calculation that repeats a number), and a tree verifies
both in the same forward: the continuation becomes a chain from the root, sharing the nodes whose tokens the tree
has too and branching off where they differ. Siblings stay distinct and the continuation depends on committed
tokens only, so every acceptance rule stays exact.

The graft runs on the device and reads nothing back: the tree grows by as many slots as the longest chain, and a
slot that a row's chain does not need (a token the tree already had, a shorter chain) is padding.
"""

from __future__ import annotations

import torch

from hf_specdec.trees.row_trees import RowTrees


def graft_chains(
    nodes: torch.Tensor, trees: RowTrees, chains: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, RowTrees]:
    """Every row's tree with its chain of tokens grafted from the root.

    Args:
        nodes (`torch.LongTensor` of shape `(batch, N)`): the token of every node, the root first.
        trees (`RowTrees`): their structure (padding nodes, which are never tried, stay padding).
        chains (`torch.LongTensor` of shape `(batch, k)`): per row, the tokens to follow the root, in order.
        lengths (`torch.LongTensor` of shape `(batch,)`): how many of `chains[b]` row b grafts.

    Returns:
        `(nodes, trees)` with `N + k` nodes: a chain token already in the tree as a child of the chain's previous
        node reuses that node; the others take the slot `N + j` of their position `j` in the chain, tried after
        their existing siblings. Slots not taken are padding.
    """
    batch, size = nodes.shape
    k = chains.shape[1]
    if k == 0:
        return nodes, trees
    device = nodes.device
    chains, lengths = chains.to(device), lengths.to(device)
    rows = torch.arange(batch, device=device)
    parents = torch.cat([trees.parents, trees.parents.new_zeros(batch, k)], dim=1)
    real = torch.cat([trees.real, trees.real.new_zeros(batch, k)], dim=1)
    at = torch.zeros(batch, dtype=torch.long, device=device)  # the chain's current node
    fresh = torch.zeros(batch, dtype=torch.bool, device=device)  # at a grafted node: no existing children
    for j in range(k):
        kids = trees.children[rows, at.clamp_max(size - 1)]  # (B, W) the current node's children
        kid = kids.clamp_min(0)
        same = (kids >= 0) & (nodes.gather(1, kid) == chains[:, j : j + 1]) & trees.real.gather(1, kid)
        same &= ~fresh[:, None]
        found = same.any(dim=1)
        existing = kids.gather(1, same.long().argmax(dim=1, keepdim=True)).squeeze(1)
        grafting = j < lengths  # (B,)
        new = grafting & ~found
        parents[:, size + j] = torch.where(new, at, 0)  # unused slots: padding, hanging from the root
        real[:, size + j] = new
        at = torch.where(grafting, torch.where(found, existing, size + j), at)
        fresh |= new
    grafted = torch.cat([nodes, chains], dim=1)  # slot N + j holds chain token j (any token where padding)
    # Parents come before children; a chain is at most k deep and adds at most one child to any node.
    structure = RowTrees.from_parents(
        parents, real, validate=False, max_depth=max(trees.depth, k), max_children=trees.children.shape[2] + 1
    )
    return grafted, structure
