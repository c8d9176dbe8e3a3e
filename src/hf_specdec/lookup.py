"""Prompt lookup drafting: propose what followed the last n-gram the last time it occurred in the row.

Code edits, summaries, answers about a document and chat that quotes its context repeat long spans of the
prompt (and of what was generated so far). Prompt lookup decoding (Saxena, 2023) drafts such spans for free:
find the row's last `n` tokens earlier in the row, and propose the tokens that followed them there. No draft
model runs, so a step costs one target forward over `1 + k` tokens per row; where nothing repeats, a row
drafts nothing and the step is a plain decoding step.

Drafts are proposed with certainty (q is 1 on the drafted token), so greedy verification keeps plain greedy's
tokens and `acceptance.point_draft_sampling` keeps the target's sampling distribution exactly.

Transformers' own `prompt_lookup_num_tokens` runs at batch size 1 and takes the earliest match; this drafter
serves any batch size, each row searching its own tokens, and takes the most recent match of the longest
n-gram (recent context predicts the continuation better: on the benchmark's prompts it accepts slightly more).
"""

from __future__ import annotations

import torch

from hf_specdec.draft_length import DraftLengthPolicy
from hf_specdec.drafting import Proposal
from hf_specdec.sequences import TokenBuffer


def lookup_continuation(tokens: torch.Tensor, max_ngram_size: int, num_tokens: int) -> torch.Tensor:
    """The tokens that followed the most recent earlier occurrence of the longest matching suffix n-gram.

    Args:
        tokens (`torch.LongTensor` of shape `(length,)`): one row's tokens, oldest first.
        max_ngram_size (`int`): the longest suffix to look for; shorter ones are tried down to a single token.
        num_tokens (`int`): the most tokens to return.

    Returns:
        `torch.LongTensor` of shape `(m,)` with `0 <= m <= num_tokens` (empty when no suffix occurs earlier).
    """
    length = tokens.shape[0]
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        # Windows that start early enough for at least one token to follow them inside the row.
        windows = tokens[: length - 1].unfold(0, n, 1)  # (length - n, n)
        hits = (windows == tokens[length - n :]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return tokens[start : start + num_tokens]
    return tokens[:0]


class PromptLookupDrafter:
    """Drafts, for every row, the continuation of its last n-gram's most recent earlier occurrence.

    Args:
        max_ngram_size (`int`): the longest n-gram to match (transformers' `max_matching_ngram_size`).
    """

    def __init__(self, max_ngram_size: int = 2) -> None:
        if not isinstance(max_ngram_size, int) or isinstance(max_ngram_size, bool) or max_ngram_size < 1:
            raise ValueError(f"max_matching_ngram_size must be a positive integer, got {max_ngram_size!r}.")
        self.max_ngram_size = max_ngram_size
        self.starts: torch.Tensor | None = None  # (A,) first real token of each active row (after left padding)

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Note where each row's real tokens start, so that left padding is never matched."""
        self.starts = valid.long().argmax(dim=1).cpu()  # (B,) first valid column (0 when the row has none)

    def start(self, first_token: torch.Tensor) -> None:
        """Nothing to do: the lookup reads committed tokens from the buffer."""

    def propose(
        self, buffer: TokenBuffer, next_position: torch.Tensor, policy: DraftLengthPolicy, max_tokens: int
    ) -> Proposal:
        """Look up up to `policy.planned_length(rows)` tokens (at most `max_tokens`) for every active row.

        Rows draft different numbers of tokens (none without a match); `k` is the longest, and shorter rows
        are padded with filler that the `lengths` of the proposal exclude from acceptance.
        """
        assert self.starts is not None
        rows = buffer.tokens[buffer.active].cpu()  # (A, width)
        num_tokens = max(0, min(policy.planned_length(rows.shape[0]), max_tokens))
        ends = buffer.active_lengths.cpu()
        found = [
            lookup_continuation(row[int(begin) : int(end)], self.max_ngram_size, num_tokens)
            for row, begin, end in zip(rows, self.starts.tolist(), ends.tolist(), strict=True)
        ]
        lengths = torch.tensor([f.numel() for f in found], dtype=torch.long)
        k = int(lengths.max()) if lengths.numel() else 0
        tokens = torch.zeros(len(found), k, dtype=torch.long)
        for i, f in enumerate(found):
            tokens[i, : f.numel()] = f
            tokens[i, f.numel() :] = f[-1] if f.numel() else 0  # filler, never accepted
        device = buffer.tokens.device
        tokens, lengths = tokens.to(device), lengths.to(device)
        buffer.write(0, tokens)
        return Proposal(tokens, lengths=lengths)

    def commit(self, num_accepted: torch.Tensor, num_drafted: int, next_token: torch.Tensor) -> None:
        """Nothing to roll back: the next lookup reads the committed tokens from the buffer."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Follow the batch when finished rows leave it."""
        assert self.starts is not None
        self.starts = self.starts[keep.cpu()]
