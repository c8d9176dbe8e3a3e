"""Acceptance rules over a tree of drafted tokens, batched, each row with its own tree.

Notation: node 0 is the root (the last committed token, fed first); every other node holds a drafted
token; `p[:, i]` is the target's next-token distribution *after* node i (so a child c of node i is right
when the target, at i, would emit c's token). A path is accepted node by node from the root; the step then
adds one token of the target's own after the last accepted node. Every rule returns, per row, that last
accepted node, how many drafted nodes lead to it, and the step's own token.

- `greedy_accept_tree`: a child is right when it is the target's argmax at its parent; the deepest node
  whose whole path is right wins (token-identical to plain greedy decoding).
- `sample_accept_tree`: lossless sampling for deterministic candidates (each node's children are distinct
  tokens chosen from the committed context alone: the heads' top-ranked ones, prompt lookup's; a point mass
  each). At a node, children are tried in order: child c is
  accepted with probability p(c); when it is rejected, c's probability is set to zero and p renormalised
  before the next child (the residual max(0, p - q) of a point mass q). If none is accepted, the step's
  token is drawn from what is left of p. The emitted tokens follow the target's distribution exactly.
- `typical_accept_tree`: Medusa's typical acceptance, **lossy** and opt-in: a child is accepted when the
  target gives it more than min(epsilon, delta * exp(-entropy(p))).
"""

from __future__ import annotations

import torch

from hf_specdec.row_trees import RowTrees


def _deepest_accepted(right: torch.Tensor, trees: RowTrees) -> tuple[torch.Tensor, torch.Tensor]:
    """From whether each node is right given its parent `(B, N)` (the root counts as right): the deepest
    node whose every ancestor is right, and its depth. Ties go to the lowest node index."""
    right = right & trees.real  # padding is never accepted
    right[:, 0] = True
    on_right_path = ~(trees.ancestors & ~right[:, None, :]).any(dim=-1)  # (B, N)
    depth = torch.where(on_right_path, trees.depths, -1)
    num_accepted, node = depth.max(dim=1)  # the first of the deepest
    return node, num_accepted


def greedy_accept_tree(
    node_tokens: torch.Tensor, target_scores: torch.Tensor, trees: RowTrees
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a tree per row.

    Args:
        node_tokens (`torch.LongTensor` of shape `(batch, nodes)`): node 0 the root, then the drafts.
        target_scores (`torch.Tensor` of shape `(batch, nodes, vocab)`): the target's scores after each node.
        trees (`RowTrees`): each row's tree.

    Returns:
        `(node, num_accepted, next_token)`, each `(batch,)`: the last accepted node, how many drafted nodes
        its path holds, and the target's argmax after it.
    """
    predicted = target_scores.argmax(dim=-1)  # (B, N) the target's token after each node
    right = node_tokens == predicted.gather(1, trees.parents.clamp_min(0))
    node, num_accepted = _deepest_accepted(right, trees)
    next_token = predicted.gather(1, node[:, None]).squeeze(1)
    return node, num_accepted, next_token


def sample_accept_tree(
    node_tokens: torch.Tensor, p: torch.Tensor, trees: RowTrees, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless sampling over trees of deterministic candidates (SpecInfer's multi-candidate rule).

    Args:
        node_tokens (`torch.LongTensor` of shape `(batch, nodes)`): node 0 the root, then the drafts.
        p (`torch.Tensor` of shape `(batch, nodes, vocab)`): the target's probabilities after each node.
        trees (`RowTrees`): each row's tree; children are tried in their order there.
        generator (`torch.Generator`, *optional*): randomness.

    Returns:
        `(node, num_accepted, next_token)` as in [`greedy_accept_tree`], `next_token` sampled.
    """
    batch = node_tokens.shape[0]
    device = node_tokens.device
    children = trees.children  # (B, N, C)
    rows = torch.arange(batch, device=device)
    current = torch.zeros(batch, dtype=torch.long, device=device)  # the node each row stands on
    searching = torch.ones(batch, dtype=torch.bool, device=device)
    residual = p[:, 0].clone()  # (B, V)
    for _ in range(trees.depth):
        moved = torch.zeros_like(searching)
        for rank in range(children.shape[2]):
            child = children[rows, current, rank]  # (B,)
            trying = searching & ~moved & (child >= 0)
            token = node_tokens[rows, child.clamp_min(0)]  # (B,)
            p_token = residual[rows, token]
            u = torch.rand(batch, device=device, dtype=p.dtype, generator=generator)
            accept = trying & (u < p_token)
            reject = trying & ~accept
            # Rejected: remove the candidate and renormalise (the residual of a point-mass draft).
            residual[rows[reject], token[reject]] = 0.0
            residual[reject] /= residual[reject].sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
            current = torch.where(accept, child, current)
            moved |= accept
            residual[accept] = p[rows[accept], child[accept]]
        searching &= moved
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return current, trees.depths[rows, current], next_token


def typical_accept_tree(
    node_tokens: torch.Tensor,
    p: torch.Tensor,
    trees: RowTrees,
    epsilon: float = 0.09,
    delta: float = 0.3,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Medusa's typical acceptance: LOSSY, the output no longer follows the target's distribution.

    A drafted node is accepted when the target's probability of it exceeds min(epsilon, delta * exp(-H)),
    with H the entropy of the target's distribution at its parent; the deepest node with an accepted path
    wins and the step's token is sampled from the target after it.
    """
    entropy = -(p * p.clamp_min(1e-12).log()).sum(dim=-1)  # (B, N)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))  # (B, N)
    parents = trees.parents.clamp_min(0)  # (B, N)
    rows = torch.arange(node_tokens.shape[0], device=node_tokens.device)
    p_token = p[rows[:, None], parents, node_tokens]  # (B, N) the target's probability at the parent
    right = p_token > threshold.gather(1, parents)
    node, num_accepted = _deepest_accepted(right, trees)
    next_token = torch.multinomial(p[rows, node], 1, generator=generator).squeeze(1)
    return node, num_accepted, next_token
