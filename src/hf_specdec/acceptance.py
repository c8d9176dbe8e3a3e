"""Acceptance rules of speculative decoding, as pure batched tensor functions.

Notation follows Leviathan et al. (2022) and Chen et al. (2022):

    p   the target's next-token distribution at a drafted position (after logits processors)
    q   the draft's next-token distribution at the same position (after the same processors)
    k   the number of drafted tokens in this step
    x   a drafted token; it is accepted with probability min(1, p(x) / q(x))

After the first rejection at position j, one token is sampled from the residual
normalise(max(0, p_j - q_j)); when all k are accepted, one "bonus" token is sampled from p_{k+1}.
Together these emit exactly the target's distribution, whatever q is.
"""

from __future__ import annotations

import torch


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


def _real_drafts(k: int, num_drafted: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | bool:
    """`(batch, k)` mask of the drafted tokens that are real (not filler), or `True` when all are."""
    if num_drafted is None:
        return True
    return torch.arange(k, device=like.device)[None, :] < num_drafted.to(like.device)[:, None]


def greedy_accept(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept drafted tokens while they equal the target's argmax.

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
    target_tokens = target_logits.argmax(dim=-1)  # (B, k+1)
    k = draft_tokens.shape[1]
    matches = (draft_tokens == target_tokens[:, :k]) & _real_drafts(k, num_drafted, draft_tokens)  # (B, k)
    num_accepted = matches.long().cumprod(dim=1).sum(dim=1)  # (B,)
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)  # (B,)
    return num_accepted, next_token


def speculative_sampling(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling over a chain of drafted tokens (Leviathan et al., Algorithm 1).

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
    batch, k = draft_tokens.shape
    p_x = p[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)  # (B, k) p(x_j)
    q_x = q.gather(2, draft_tokens[..., None]).squeeze(2)  # (B, k) q(x_j)
    u = torch.rand((batch, k), device=p.device, dtype=p.dtype, generator=generator)  # (B, k)
    accepted = u * q_x < p_x  # (B, k)  u < p/q without dividing by a possibly tiny q
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,)

    # Where to sample the last token from: the residual at the first rejection, or p after the last draft.
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # (B, k+1, V); q = 0 makes the residual p
    rows = torch.arange(batch, device=p.device)
    final = residual_distribution(p[rows, num_accepted], q_padded[rows, num_accepted])  # (B, V)
    next_token = torch.multinomial(final, num_samples=1, generator=generator).squeeze(1)  # (B,)
    return num_accepted, next_token


def point_draft_sampling(
    draft_tokens: torch.Tensor,
    p: torch.Tensor,
    num_drafted: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling for drafts proposed with certainty (q is 1 on each drafted token), such as
    prompt lookup's: [`speculative_sampling`] with one-hot q, without building q.

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
    batch, k = draft_tokens.shape
    p_x = p[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)  # (B, k)
    u = torch.rand((batch, k), device=p.device, dtype=p.dtype, generator=generator)  # (B, k)
    accepted = (u < p_x) & _real_drafts(k, num_drafted, draft_tokens)  # (B, k)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,)

    rows = torch.arange(batch, device=p.device)
    final = p[rows, num_accepted].clone()  # (B, V)
    drafted = num_drafted.to(p.device) if num_drafted is not None else torch.full_like(num_accepted, k)
    rejected = num_accepted < drafted  # (B,) stopped at a real draft, not after the last one
    if bool(rejected.any()):
        rejected_token = draft_tokens.gather(1, num_accepted.clamp_max(max(k - 1, 0))[:, None]).squeeze(1)
        final[rows[rejected], rejected_token[rejected]] = 0.0
        final = final / final.sum(dim=-1, keepdim=True)
    next_token = torch.multinomial(final, num_samples=1, generator=generator).squeeze(1)  # (B,)
    return num_accepted, next_token
