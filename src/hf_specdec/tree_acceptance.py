"""Acceptance rules over a tree of drafted tokens, batched.

Notation: node 0 is the root (the last committed token, fed first); every other node holds a drafted
token; `p[:, i]` is the target's next-token distribution *after* node i (so a child c of node i is right
when the target, at i, would emit c's token). A path is accepted node by node from the root; the step then
adds one token of the target's own after the last accepted node.

- `greedy_accept_tree`: a child is right when it is the target's argmax at its parent; the longest right
  path wins (token-identical to plain greedy decoding).
- `sample_accept_tree`: lossless sampling for deterministic candidates (each node's children are the
  draft's top-ranked tokens, a point mass each). At a node, children are tried in rank order: child c is
  accepted with probability p(c); when it is rejected, c's probability is set to zero and p renormalised
  before the next child (the residual max(0, p - q) of a point mass q). If none is accepted, the step's
  token is drawn from what is left of p. The emitted tokens follow the target's distribution exactly.
- `typical_accept_tree`: Medusa's typical acceptance, **lossy** and opt-in: a child is accepted when the
  target gives it more than min(epsilon, delta * exp(-entropy(p))).
"""

from __future__ import annotations

import torch

from hf_specdec.tree import DraftTree


def _path_tokens(node_tokens: torch.Tensor, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens `(B, L, D)` of every root-to-leaf path (below the root) and where paths exist `(L, D)`."""
    below_root = tree.paths[:, 1:].to(node_tokens.device)  # (L, D)
    exists = below_root >= 0
    tokens = node_tokens[:, below_root.clamp_min(0)]  # (B, L, D)
    return tokens, exists


def _best_path(accepted: torch.Tensor, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From per-path, per-depth acceptance `(B, L, D)`: the best path, its accepted length, its last node."""
    lengths = accepted.long().cumprod(dim=2).sum(dim=2)  # (B, L)
    num_accepted, best = lengths.max(dim=1)  # first of the longest
    paths = tree.paths.to(accepted.device)
    last_node = paths[best, num_accepted]  # (B,)
    return best, num_accepted, last_node


def greedy_accept_tree(
    node_tokens: torch.Tensor, target_scores: torch.Tensor, tree: DraftTree
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a tree.

    Args:
        node_tokens (`torch.LongTensor` of shape `(batch, nodes)`): node 0 the root, then the drafts.
        target_scores (`torch.Tensor` of shape `(batch, nodes, vocab)`): the target's scores after each node.
        tree (`DraftTree`): the tree's structure.

    Returns:
        `(path, num_accepted, next_token)`, each `(batch,)`: the index of the accepted path in `tree.paths`,
        how many of its drafted nodes are accepted, and the target's argmax after the last of them.
    """
    predicted = target_scores.argmax(dim=-1)  # (B, N) the target's token after each node
    tokens, exists = _path_tokens(node_tokens, tree)  # (B, L, D)
    parents = tree.paths[:, :-1].to(node_tokens.device).clamp_min(0)  # (L, D) parent of each path node
    accepted = exists[None] & (tokens == predicted[:, parents])  # (B, L, D)
    best, num_accepted, last_node = _best_path(accepted, tree)
    next_token = predicted.gather(1, last_node[:, None]).squeeze(1)
    return best, num_accepted, next_token


def sample_accept_tree(
    node_tokens: torch.Tensor, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless sampling over a tree of deterministic candidates (SpecInfer's multi-candidate rule).

    Args:
        node_tokens (`torch.LongTensor` of shape `(batch, nodes)`): node 0 the root, then the drafts.
        p (`torch.Tensor` of shape `(batch, nodes, vocab)`): the target's probabilities after each node.
        tree (`DraftTree`): the tree's structure; children are tried in rank order.
        generator (`torch.Generator`, *optional*): randomness.

    Returns:
        `(path, num_accepted, next_token)` as in [`greedy_accept_tree`], `next_token` sampled.
    """
    batch = node_tokens.shape[0]
    device = node_tokens.device
    children = tree.children.to(device)  # (N, C)
    rows = torch.arange(batch, device=device)
    current = torch.zeros(batch, dtype=torch.long, device=device)  # the node each row stands on
    searching = torch.ones(batch, dtype=torch.bool, device=device)
    residual = p[:, 0].clone()  # (B, V)
    for _ in range(tree.depth):
        moved = torch.zeros_like(searching)
        for rank in range(children.shape[1]):
            child = children[current, rank]  # (B,)
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
    return _locate(current, tree), tree.depths.to(device)[current], next_token


def typical_accept_tree(
    node_tokens: torch.Tensor,
    p: torch.Tensor,
    tree: DraftTree,
    epsilon: float = 0.09,
    delta: float = 0.3,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Medusa's typical acceptance: LOSSY, the output no longer follows the target's distribution.

    A drafted node is accepted when the target's probability of it exceeds min(epsilon, delta * exp(-H)),
    with H the entropy of the target's distribution at its parent; the longest accepted path wins and the
    step's token is sampled from the target after it.
    """
    entropy = -(p * p.clamp_min(1e-12).log()).sum(dim=-1)  # (B, N)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))  # (B, N)
    tokens, exists = _path_tokens(node_tokens, tree)  # (B, L, D)
    parents = tree.paths[:, :-1].to(node_tokens.device).clamp_min(0)  # (L, D)
    p_token = p[:, parents].gather(3, tokens[..., None]).squeeze(3)  # (B, L, D)
    accepted = exists[None] & (p_token > threshold[:, parents])
    best, num_accepted, last_node = _best_path(accepted, tree)
    rows = torch.arange(node_tokens.shape[0], device=node_tokens.device)
    next_token = torch.multinomial(p[rows, last_node], 1, generator=generator).squeeze(1)
    return best, num_accepted, next_token


def _locate(node: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """The index of a path in `tree.paths` that passes through each `node` `(B,)`."""
    paths = tree.paths.to(node.device)  # (L, D+1)
    depth = tree.depths.to(node.device)[node]  # (B,)
    at_depth = paths[:, depth]  # (L, B): every path's node at each row's depth
    return (at_depth == node[None, :]).float().argmax(dim=0)
