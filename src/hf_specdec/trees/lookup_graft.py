"""Prompt lookup inside a tree: graft each row's looked-up continuation onto the heads' tree.

The heads guess from the base's hidden state; prompt lookup (see `hf_specdec.drafters.lookup`) copies what followed
the row's last n-gram the last time it occurred. They are right in different places (a reply that quotes
its prompt, code that restates a signature, a calculation that repeats a number), and a tree verifies both
in the same forward: the continuation becomes a chain from the root, sharing the nodes whose tokens the
heads proposed too and branching off where they differ. Siblings stay distinct and the continuation
depends on committed tokens only, so every acceptance rule stays exact.
"""

from __future__ import annotations

import torch

from hf_specdec.trees.row_trees import RowTrees


def graft_chains(
    nodes: torch.Tensor, trees: RowTrees, chains: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, RowTrees]:
    """Every row's tree with its chain of tokens grafted from the root.

    Args:
        nodes (`torch.LongTensor` of shape `(batch, nodes)`): the token of every node, the root first.
        trees (`RowTrees`): their structure (padding nodes, which are never tried, stay padding).
        chains (`torch.LongTensor` of shape `(batch, k)`): per row, the tokens to follow the root, in order.
        lengths (`torch.LongTensor` of shape `(batch,)`): how many of `chains[b]` row b grafts.

    Returns:
        `(nodes, trees)`: a chain token already in the tree as a child of the chain's previous node reuses that
        node; the others become new nodes, numbered after the existing ones and tried after their existing
        siblings. Rows that added fewer nodes than the widest are padded (`trees.real`).
    """
    if not bool((lengths > 0).any()):
        return nodes, trees
    device = nodes.device
    all_tokens, all_parents, all_real = [], [], []
    for row_tokens, row_parents, row_real, chain, length in zip(
        nodes.tolist(), trees.parents.tolist(), trees.real.tolist(), chains.tolist(), lengths.tolist(), strict=True
    ):
        pairs = enumerate(zip(row_parents, row_tokens, row_real, strict=True))
        child = {(parent, token): node for node, (parent, token, real) in pairs if node and real}  # -> node
        at = 0
        for token in chain[:length]:
            found = child.get((at, token))
            if found is None:
                row_tokens.append(token)
                row_parents.append(at)
                row_real.append(True)
                found = child[(at, token)] = len(row_tokens) - 1
            at = found
        all_tokens.append(row_tokens)
        all_parents.append(row_parents)
        all_real.append(row_real)
    width = max(len(t) for t in all_tokens)
    real = torch.tensor([r + [False] * (width - len(r)) for r in all_real], device=device)
    tokens = torch.tensor([t + [t[0]] * (width - len(t)) for t in all_tokens], device=device)  # padding: any token
    parents = torch.tensor([p + [0] * (width - len(p)) for p in all_parents], device=device)
    return tokens, RowTrees.from_parents(parents, real, validate=False)  # parents appended before children
