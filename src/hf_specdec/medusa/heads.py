"""Medusa heads: K small networks on the base's last hidden state, each predicting a token further ahead."""

from __future__ import annotations

import torch
from torch import nn


class ResBlock(nn.Module):
    """`x + SiLU(W x + b)`, with W initialised to zero so that a fresh head starts as the identity
    (then its projection, initialised from the base's lm_head, predicts what the base predicts)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + nn.functional.silu(self.linear(hidden))


class MedusaHeads(nn.Module):
    """K heads. Each is its own stack of `ResBlock`s (independent weights: building the stack with
    `[ResBlock(h)] * n` would share one block's weights across layers) and a vocabulary projection, either
    its own or the base's `lm_head`.

    Args:
        num_heads (`int`): K.
        num_layers (`int`): residual blocks per head.
        hidden_size (`int`): the base's hidden size.
        vocab_size (`int`): the base's number of logits.
        share_lm_head (`bool`): use the base's `lm_head` (passed to `forward`) instead of own projections.
    """

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int, share_lm_head: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers))) for _ in range(num_heads)
        )
        self.projections = (
            None
            if share_lm_head
            else nn.ModuleList(nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))
        )

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def init_projections_from(self, lm_head: nn.Module) -> None:
        """Copy the base's lm_head weights into every own projection (Medusa's initialisation)."""
        if self.projections is None:
            return
        with torch.no_grad():
            for projection in self.projections:
                projection.weight.copy_(lm_head.weight)

    def head(self, k: int, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits `(..., vocab)` of head `k` on hidden states `(..., hidden)`."""
        projection = lm_head if self.projections is None else self.projections[k]
        return projection(self.blocks[k](hidden))

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits of every head.

        Args:
            hidden (`torch.Tensor` of shape `(batch, seq, hidden)`): the base's last hidden states (after its
                final norm, as its lm_head sees them).
            lm_head (`nn.Module`): the base's output projection, used when the heads share it.

        Returns:
            `torch.Tensor` of shape `(num_heads, batch, seq, vocab)`.
        """
        return torch.stack([self.head(k, hidden, lm_head) for k in range(self.num_heads)], dim=0)
