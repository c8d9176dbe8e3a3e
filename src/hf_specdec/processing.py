"""Apply transformers' `LogitsProcessorList` at many positions of a ragged batch at once.

Plain `generate()` calls its processors once per token with the whole batch, whose rows all have the same
length. Speculative decoding needs the processed scores at every drafted position, and rows of a batch
have committed different numbers of tokens, so position j of row b sees the prefix
`tokens[b, :lengths[b] + j]` (its prompt with the same left padding as plain `generate()`, its committed
tokens, then the drafted tokens before j). Processors that read the prefix (repetition penalty, minimum
length, n-gram bans, ...) are called once per distinct prefix length, with the whole batch in its original
row order (some processors keep per-row state, such as the left-padding length), and the rows whose
position has that prefix length are read back. Processors that only look at the scores (temperature, top-k,
top-p, ...) are called once on everything.
"""

from __future__ import annotations

import torch
from transformers import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

# Processors whose output depends on the scores alone, not on the prefix they are called with.
_PREFIX_FREE = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


class RaggedLogitsProcessor:
    """Wraps a `LogitsProcessorList` so it can score `(batch, n, vocab)` logits with per-row prefixes.

    Args:
        processors (`LogitsProcessorList`): the processors `generate()` built from the generation config.
    """

    def __init__(self, processors: LogitsProcessorList) -> None:
        self.processors = processors
        # Exact types: a subclass may read the prefix.
        self.prefix_free = all(type(p) in _PREFIX_FREE for p in processors)

    def __call__(
        self, tokens: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor:
        """Process logits at n consecutive positions of each row.

        Args:
            tokens (`torch.LongTensor` of shape `(total_batch, buffer)`): every row's tokens; the drafted
                tokens of this step are already written after each row's committed tokens.
            rows (`torch.LongTensor` of shape `(batch,)`): which rows of `tokens` the logits belong to.
            lengths (`torch.LongTensor` of shape `(batch,)`): prefix length at the first of the n positions.
            logits (`torch.Tensor` of shape `(batch, n, vocab)`): raw scores, float32.

        Returns:
            `torch.Tensor` of shape `(batch, n, vocab)`: the processed scores.
        """
        if not self.processors:
            return logits
        batch, n, vocab = logits.shape
        if self.prefix_free:
            flat = logits.reshape(batch * n, vocab)  # (B*n, V)
            dummy = tokens.new_zeros(batch * n, 1)  # these processors never read the prefix
            return self.processors(dummy, flat).reshape(batch, n, vocab)
        prefix_lengths = lengths[:, None] + torch.arange(n, device=lengths.device)  # (B, n)
        out = torch.empty_like(logits)
        full = logits.new_zeros(tokens.shape[0], vocab)  # (total_batch, V): every row at its own index
        for length in torch.unique(prefix_lengths).tolist():
            b, j = (prefix_lengths == length).nonzero(as_tuple=True)  # pairs whose prefix has this length
            full[rows[b]] = logits[b, j]
            # Rows not in this group see whatever their buffer holds; their results are not read.
            out[b, j] = self.processors(tokens[:, :length], full.clone())[rows[b]]
        return out
