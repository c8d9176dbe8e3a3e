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


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept drafted tokens while they equal the target's argmax.

    Args:
        draft_tokens (`torch.LongTensor` of shape `(batch, k)`): the drafted tokens.
        target_logits (`torch.Tensor` of shape `(batch, k + 1, vocab)`): the target's (processed) scores at the
            k drafted positions and the one after them.

    Returns:
        `(num_accepted, next_token)`: `num_accepted` `(batch,)` in `[0, k]`, the length of the accepted prefix;
        `next_token` `(batch,)`, the target's argmax right after it (a correction, or the bonus token).
    """
    target_tokens = target_logits.argmax(dim=-1)  # (B, k+1)
    k = draft_tokens.shape[1]
    matches = draft_tokens == target_tokens[:, :k]  # (B, k)
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
