"""Acceptance rules of speculative decoding over trees of drafted tokens, batched, each row with its own tree;
a chain of drafts is the tree of width one.

Notation (Leviathan et al. 2022; Chen et al. 2022): node 0 is the root (the last committed token, fed first);
every other node holds a drafted token; `p[:, i]` is the target's next-token distribution *after* node i (so
a child c of node i is right when the target, at i, would emit c's token); `q[:, i]` is the distribution the
drafter drew node i's children from. A path is accepted node by node from the root; the step then adds one
token of the target's own after the last accepted node. Every tree rule returns, per row, that last accepted
node, how many drafted nodes lead to it, and the step's own token. Trees are [`RowTrees`]; padding nodes
(`real` False) are never accepted.

- [`greedy_accept_tree`]: a child is right when it is the target's argmax at its parent; the deepest node whose
  whole path is right wins (token-identical to plain greedy decoding).
- [`sample_accept_tree`]: lossless sampling, the recursive rejection rule of multi-candidate speculative
  sampling. At a node the children are tried in their order, against what is left of p and q there:

      child c is accepted with probability min(1, p(c) / q(c));
      on rejection   p <- normalise(max(0, p - q))   then   q <- q with c's mass removed, renormalised;
      when every child is rejected, the step's token is drawn from the last p.

  With `q` given, a node's children must have been drawn one after the other from q at that node *without
  replacement* (`torch.multinomial(q, n, replacement=False)`): the sampling without replacement of MCSD (Yang
  et al. 2024, "Multi-Candidate Speculative Decoding"), also the recursive rejection sampling of Jeon et al.
  2024 ("Recursive Speculative Decoding"). SpecInfer's multi-step speculative sampling (Miao et al. 2024) is
  the same recursion for independent candidates, whose q stays as it is.
  Without `q`, every child is a certain proposal (q a point mass on it: a head's top-k, prompt lookup's,
  EAGLE-2's `evaluate_posterior` with `qx = 1`): accepted with probability p(c); a rejection zeroes c in p and
  renormalises. That rule is exact whatever chose the candidates (given them, it emits p), only it accepts
  less than the rule with q for children drawn from q. A child that q gives no mass cannot have been drawn
  from q: it is taken as a certain proposal (a grafted lookup token, for one; its token must not depend on the
  siblings tried after it), and q is left as it is. Chains: [`speculative_sampling`] (q) and
  [`point_draft_sampling`] (no q).
- [`typical_accept_tree`]: Medusa's typical acceptance, **lossy** and opt-in: a child is accepted when the
  target gives it more than min(epsilon, delta * exp(-entropy(p))).

Why the sampling rule is lossless, by induction on the number of children left at a node. None left: the token
is drawn from p. Otherwise the next child c is distributed as q (conditionally on everything tried before);
accepting it with probability min(1, p(c) / q(c)) emits each token x with probability min(p(x), q(x)) and
rejects with probability beta = sum_x max(0, p(x) - q(x)). Given a rejection of c, the remaining children are
drawn from q without c, renormalised, so the rest of the procedure is the same rule with p' = max(0, p - q) /
beta and that q; by induction it emits p'. In all, x comes out with min(p, q)(x) + beta * p'(x) = p(x). An
accepted child's own subtree then faces p and q after that child: the argument repeats one level down. A
certain child is the case q = onehot(c) (residual: p without c), which leaves the sampled siblings' q as it was.
"""

from __future__ import annotations

import dataclasses

import torch

from hf_specdec.trees.row_trees import RowTrees


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to resample from after a rejection: normalise(max(0, p - q)).

    Args:
        p (`torch.Tensor` of shape `(..., vocab)`): target probabilities.
        q (`torch.Tensor` of shape `(..., vocab)`): draft probabilities.

    Returns:
        `torch.Tensor` of shape `(..., vocab)`. Where p == q everywhere the residual has no mass; a rejection
        cannot happen there (the acceptance probability is 1), and `p` itself is returned so the result is
        always a valid distribution.
    """
    residual = (p - q).clamp_min(0.0)  # (..., V)
    mass = residual.sum(dim=-1, keepdim=True)  # (..., 1)
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(p.dtype).tiny), p)


def _without_certain(p: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The residual of a certain proposal `token` `(B,)`: `p` `(B, V)` without it, renormalised (`p` itself
    where nothing else is left)."""
    removed = p.scatter(1, token[:, None], 0.0)
    mass = removed.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, removed / mass.clamp_min(torch.finfo(p.dtype).tiny), p)


def _without_drafted(q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """What the drafter draws the next sibling from after drawing `token` `(B,)`: `q` `(B, V)` without it,
    renormalised (all zero where nothing is left: any further sibling is then a certain proposal)."""
    removed = q.scatter(1, token[:, None], 0.0)
    return removed / removed.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)


# ---------------------------------------------------------------------------------------------------------
# Tree rules
# ---------------------------------------------------------------------------------------------------------


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


def greedy_accept_chain(
    node_tokens: torch.Tensor, target_scores: torch.Tensor, trees: RowTrees
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`greedy_accept_tree` for chains numbered in order (node j's parent is node j - 1), in fewer operations: the
    accepted drafts are the longest prefix the target's argmax agrees with (padding never agrees)."""
    predicted = target_scores.argmax(dim=-1)  # (B, N)
    right = (node_tokens[:, 1:] == predicted[:, :-1]) & trees.real[:, 1:]  # (B, N-1)
    num_accepted = right.long().cumprod(dim=1).sum(dim=1)  # (B,)
    next_token = predicted.gather(1, num_accepted[:, None]).squeeze(1)
    return num_accepted, num_accepted, next_token


class _Leftovers:
    """Per row, what is left of p and q at the node the row stands on, after the children it rejected there.

    A rejection is only recorded (`reject`) and folded into the residuals when they are next needed: before
    a sibling's test, or for the step's own token. A chain (one child per node) thus computes one residual per
    step, like the classic rule, instead of one per depth.
    """

    def __init__(self, p: torch.Tensor, q: torch.Tensor | None) -> None:
        batch = p.shape[0]
        self.p, self.q = p, q
        self.rows = torch.arange(batch, device=p.device)
        self.p_left: torch.Tensor | None = None  # (B, V), valid where `here`
        self.q_left: torch.Tensor | None = None  # (B, V), valid where `here` (with q only)
        self.here = torch.zeros(batch, dtype=torch.bool, device=p.device)  # residuals built at this node
        self.pending = torch.zeros_like(self.here)  # a rejection not folded in yet
        self.token = torch.zeros(batch, dtype=torch.long, device=p.device)  # ... of this token
        self.sampled = torch.zeros_like(self.here)  # ... drawn from q (else a certain proposal)

    def reject(self, mask: torch.Tensor, token: torch.Tensor, sampled: torch.Tensor) -> None:
        """Rows `mask` rejected `token`, drawn from q where `sampled`."""
        self.pending = self.pending | mask
        self.token = torch.where(mask, token, self.token)
        self.sampled = torch.where(mask, sampled, self.sampled)

    def leave(self, moved: torch.Tensor) -> None:
        """Rows `moved` accepted a child: they stand on a node where nothing was rejected yet."""
        self.here = self.here & ~moved

    def fold(self, mask: torch.Tensor, current: torch.Tensor) -> None:
        """Fold the pending rejection of rows `mask` into their residuals at node `current` `(B,)`."""
        p_left = self.p[self.rows, current]  # (B, V)
        if self.p_left is not None:
            p_left = torch.where(self.here[:, None], self.p_left, p_left)
        new_p = _without_certain(p_left, self.token)
        if self.q is not None:
            q_left = self.q[self.rows, current.clamp_max(self.q.shape[1] - 1)]  # trailing leaves may lack q
            if self.q_left is not None:
                q_left = torch.where(self.here[:, None], self.q_left, q_left)
            sampled = self.sampled[:, None]
            new_p = torch.where(sampled, residual_distribution(p_left, q_left), new_p)  # q before removing c
            self.q_left = torch.where(mask[:, None] & sampled, _without_drafted(q_left, self.token), q_left)
        self.p_left = torch.where(mask[:, None], new_p, p_left)
        self.here = self.here | mask
        self.pending = self.pending & ~mask

    def at(
        self, token: torch.Tensor, p_token: torch.Tensor, q_token: torch.Tensor | None, current: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """p and q of `token` `(B,)` after the rejections at `current`, where there were any; `p_token`,
        `q_token` (those at the parent, untouched) elsewhere."""
        self.fold(self.pending, current)
        assert self.p_left is not None
        p_token = torch.where(self.here, self.p_left[self.rows, token], p_token)
        if q_token is not None and self.q_left is not None:
            q_token = torch.where(self.here, self.q_left[self.rows, token], q_token)
        return p_token, q_token

    def final(self, current: torch.Tensor) -> torch.Tensor:
        """`(B, V)` what the step's own token is drawn from: what is left of p at `current`."""
        self.fold(self.pending, current)
        assert self.p_left is not None
        return self.p_left


def sample_accept_tree(
    node_tokens: torch.Tensor,
    p: torch.Tensor,
    trees: RowTrees,
    generator: torch.Generator | None = None,
    q: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless sampling over a tree per row: the recursive rejection rule (see the module's docstring).

    Args:
        node_tokens (`torch.LongTensor` of shape `(batch, nodes)`): node 0 the root, then the drafts.
        p (`torch.Tensor` of shape `(batch, nodes, vocab)`): the target's probabilities after each node.
        trees (`RowTrees`): each row's tree; children are tried in their order there.
        generator (`torch.Generator`, *optional*): randomness.
        q (`torch.Tensor` of shape `(batch, nodes, vocab)`, *optional*): the distribution each node's children
            were drawn from, one after the other without replacement (rows at nodes without children are not
            read, and may be left out at the end: a chain's q is `(batch, nodes - 1, vocab)`). Children that q
            gives no mass, and all children when `q` is None, are certain proposals (q a point mass on each).

    Returns:
        `(node, num_accepted, next_token)` as in [`greedy_accept_tree`], `next_token` sampled. Probabilities are
        handled in float32 at least. Randomness: one uniform per drafted node, `torch.rand((batch, nodes - 1))`
        (each node is tried at most once), then one `torch.multinomial` draw per row.
    """
    batch, num_nodes = node_tokens.shape
    dtype = torch.promote_types(p.dtype, torch.float32)
    p = p.to(dtype)
    q = None if q is None or q.shape[1] == 0 else q.to(device=p.device, dtype=dtype)  # no q: nothing drafted
    device = node_tokens.device
    rows = torch.arange(batch, device=device)
    u = torch.rand((batch, num_nodes - 1), device=p.device, dtype=dtype, generator=generator)  # (B, N-1)
    # A node's first try at its parent reads p and q as they are: gathered for every node at once.
    parents = trees.parents.clamp_min(0)  # (B, N)
    p_first = p[rows[:, None], parents, node_tokens]  # (B, N) p(token) at the parent
    q_first = None if q is None else q[rows[:, None], parents.clamp_max(q.shape[1] - 1), node_tokens]
    left = _Leftovers(p, q)
    current = torch.zeros(batch, dtype=torch.long, device=device)  # the node each row stands on
    searching = torch.ones(batch, dtype=torch.bool, device=device)
    for _ in range(trees.depth):
        moved = torch.zeros_like(searching)
        for rank in range(trees.children.shape[2]):
            child = trees.children[rows, current, rank]  # (B,)
            node = child.clamp_min(0)
            trying = searching & ~moved & (child >= 0) & trees.real[rows, node]
            token = node_tokens[rows, node]
            p_token = p_first[rows, node]
            q_token = None if q_first is None else q_first[rows, node]
            if rank > 0:  # earlier siblings may have been rejected here
                p_token, q_token = left.at(token, p_token, q_token, current)
            sampled = torch.zeros_like(trying) if q_token is None else q_token > 0
            q_token = p_token.new_ones(()) if q_token is None else torch.where(sampled, q_token, 1.0)
            accept = trying & (u[rows, node - 1] * q_token < p_token)  # u < p/q without dividing by q
            left.reject(trying & ~accept, token, sampled)
            left.leave(accept)
            current = torch.where(accept, child, current)
            moved |= accept
        searching &= moved
    next_token = torch.multinomial(left.final(current), 1, generator=generator).squeeze(1)
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


# ---------------------------------------------------------------------------------------------------------
# Chains: the tree rules on `RowTrees.chain`
# ---------------------------------------------------------------------------------------------------------


def _as_chain(draft_tokens: torch.Tensor, num_drafted: torch.Tensor | None) -> tuple[torch.Tensor, RowTrees]:
    """A chain's node tokens `(batch, k + 1)` (the root's, never read, is 0) and trees; drafts past a row's
    `num_drafted` are padding."""
    batch, k = draft_tokens.shape
    trees = RowTrees.chain(k + 1, draft_tokens.device).expand(batch)
    if num_drafted is not None:
        trees = dataclasses.replace(trees, real=trees.depths <= num_drafted.to(draft_tokens.device)[:, None])
    return torch.cat([draft_tokens.new_zeros(batch, 1), draft_tokens], dim=1), trees


def greedy_accept(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept drafted tokens while they equal the target's argmax ([`greedy_accept_tree`]
    on a chain).

    Args:
        draft_tokens (`torch.LongTensor` of shape `(batch, k)`): the drafted tokens.
        target_logits (`torch.Tensor` of shape `(batch, k + 1, vocab)`): the target's (processed) scores at the
            k drafted positions and the one after them.
        num_drafted (`torch.LongTensor` of shape `(batch,)`, *optional*): how many of the k tokens row b really
            drafted (the rest is filler, never accepted); default all k.

    Returns:
        `(num_accepted, next_token)`: `num_accepted` `(batch,)` in `[0, k]`, the length of the accepted prefix;
        `next_token` `(batch,)`, the target's argmax right after it (a correction, or the bonus token).
    """
    nodes, trees = _as_chain(draft_tokens, num_drafted)
    _, num_accepted, next_token = greedy_accept_tree(nodes, target_logits, trees)
    return num_accepted, next_token


def speculative_sampling(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling over a chain of drafted tokens (Leviathan et al., Algorithm 1):
    [`sample_accept_tree`] with q on a chain.

    Drafted token x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j)); after the first rejection the
    next token is drawn from the residual normalise(max(0, p_j - q_j)), and after k acceptances from p_k. A
    drafted token that q gives no mass is taken as a certain proposal (accepted with probability p_j(x_j)).

    Args:
        draft_tokens (`torch.LongTensor` of shape `(batch, k)`): tokens sampled from q.
        q (`torch.Tensor` of shape `(batch, k, vocab)`): draft probabilities at each drafted position.
        p (`torch.Tensor` of shape `(batch, k + 1, vocab)`): target probabilities at each drafted position and
            the one after them.
        generator (`torch.Generator`, *optional*): source of randomness, for reproducible runs.

    Returns:
        `(num_accepted, next_token)` as in [`greedy_accept`]: `next_token` is drawn from the residual at the
        first rejected position, or from `p[:, k]` when all k drafted tokens are accepted.
    """
    nodes, trees = _as_chain(draft_tokens, None)
    _, num_accepted, next_token = sample_accept_tree(nodes, p, trees, generator, q=q)
    return num_accepted, next_token


def point_draft_sampling(
    draft_tokens: torch.Tensor,
    p: torch.Tensor,
    num_drafted: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling for drafts proposed with certainty (q is 1 on each drafted token), such as
    prompt lookup's: [`sample_accept_tree`] without q on a chain.

    Drafted token x_j is accepted with probability p_j(x_j); after a rejection the residual
    normalise(max(0, p_j - onehot(x_j))) is p_j without x_j; after the last real draft, the next token is
    drawn from p itself.

    Args:
        draft_tokens (`torch.LongTensor` of shape `(batch, k)`): the drafted tokens.
        p (`torch.Tensor` of shape `(batch, k + 1, vocab)`): target probabilities at each drafted position and
            the one after them.
        num_drafted (`torch.LongTensor` of shape `(batch,)`, *optional*): real drafts per row, as in
            [`greedy_accept`].
        generator (`torch.Generator`, *optional*): source of randomness, for reproducible runs.

    Returns:
        `(num_accepted, next_token)` as in [`greedy_accept`].
    """
    nodes, trees = _as_chain(draft_tokens, num_drafted)
    _, num_accepted, next_token = sample_accept_tree(nodes, p, trees, generator)
    return num_accepted, next_token
