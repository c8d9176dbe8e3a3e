"""The token side of a ragged batch: every row's tokens, its length, and when it stops.

Rows commit different numbers of tokens per step. Each row's tokens are kept left-aligned in one buffer,
exactly as plain `generate()` would have them (prompt with its left padding, then generated tokens), so
logits processors and stopping criteria see the same prefixes they would see in plain decoding.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria


class TokenBuffer:
    """Tokens of every row of the batch, with per-row lengths and the set of rows still running.

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        generation_config (`GenerationConfig`): as prepared by `generate()` (its `max_length` is final).
        stopping_criteria (`StoppingCriteriaList`): `generate()`'s criteria. Length and EOS criteria are
            applied here exactly and in a vectorised way (the shortest length, every EOS id); the others
            are called on each row's exact prefix.
        scratch (`int`): room after `max_length` for the drafted tokens of a step.
    """

    def __init__(
        self,
        input_ids: torch.Tensor,
        generation_config: GenerationConfig,
        stopping_criteria: StoppingCriteriaList,
        scratch: int,
    ) -> None:
        batch, prompt = input_ids.shape
        lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
        max_length = min([generation_config.max_length, *lengths])
        eos = [c.eos_token_id.reshape(-1) for c in stopping_criteria if isinstance(c, EosTokenCriteria)]
        if generation_config._eos_token_tensor is not None:
            eos.append(generation_config._eos_token_tensor.reshape(-1))
        eos_token_ids = torch.cat(eos).to(input_ids.device).unique() if eos else None
        self.prompt_length = prompt
        self.max_length = max_length
        self.tokens = input_ids.new_zeros(batch, max_length + scratch)  # (B, max_length + scratch)
        self.tokens[:, :prompt] = input_ids
        self.lengths = torch.full((batch,), prompt, dtype=torch.long, device=input_ids.device)  # (B,)
        self.active = torch.arange(batch, device=input_ids.device)  # rows still running, original indices
        self.eos = eos_token_ids
        self.criteria = StoppingCriteriaList(
            c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))
        )

    @property
    def active_lengths(self) -> torch.Tensor:
        return self.lengths[self.active]

    def write(self, offset: int, new_tokens: torch.Tensor) -> None:
        """Write `(active, m)` tokens at each active row's length + `offset`, without committing them."""
        columns = self.active_lengths[:, None] + offset + torch.arange(new_tokens.shape[1], device=self.tokens.device)
        self.tokens[self.active[:, None], columns] = new_tokens

    def commit(
        self, new_tokens: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append to every active row its first `counts[b]` new tokens, stopping where plain decoding would.

        Args:
            new_tokens (`torch.LongTensor` of shape `(active, m)`): candidate tokens to append, in order.
            counts (`torch.LongTensor` of shape `(active,)`): how many of them each row accepted, `>= 1`.
            scores (`torch.Tensor` of shape `(active, m, vocab)`, *optional*): the processed target scores
                that chose each token, passed to custom stopping criteria as plain `generate()` does.

        Returns:
            `(emitted, finished)`: `emitted` `(active,)` tokens actually appended; `finished` `(active,)` rows
            that stopped (EOS, length limit or a stopping criterion).
        """
        m = new_tokens.shape[1]
        lengths = self.active_lengths
        self.write(0, new_tokens)
        offsets = torch.arange(m, device=new_tokens.device)[None, :]  # (1, m)
        counts = torch.minimum(counts, self.max_length - lengths)
        finished = lengths + counts >= self.max_length
        if self.eos is not None:
            is_eos = torch.isin(new_tokens, self.eos) & (offsets < counts[:, None])  # (A, m)
            first_eos = torch.where(is_eos, offsets, m).min(dim=1).values  # (A,)
            hit = first_eos < m
            counts = torch.where(hit, first_eos + 1, counts)
            finished |= hit
        if self.criteria:
            counts, stopped = self._apply_criteria(lengths, counts, scores)
            finished |= stopped
        self.lengths[self.active] = lengths + counts
        return counts, finished

    def _apply_criteria(
        self, lengths: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stopped = torch.zeros_like(counts, dtype=torch.bool)
        for j in range(int(counts.max())):
            rows = ((counts > j) & ~stopped).nonzero(as_tuple=True)[0]
            for length in torch.unique(lengths[rows] + j + 1).tolist():
                group = rows[lengths[rows] + j + 1 == length]
                step_scores = scores[group, j] if scores is not None else None
                hit = self.criteria(self.tokens[self.active[group], :length], step_scores)
                hit = hit.to(group.device)
                counts[group[hit]] = j + 1
                stopped[group[hit]] = True
        return counts, stopped

    def retire(self, finished: torch.Tensor) -> torch.Tensor:
        """Drop finished rows from the active set; returns the positions (in the old active order) kept."""
        keep = (~finished).nonzero(as_tuple=True)[0]
        self.active = self.active[keep]
        return keep

    def sequences(self, pad_token_id: int) -> torch.Tensor:
        """The output of `generate()`: `(batch, prompt + longest generation)`, padded after each row's end."""
        width = int(self.lengths.max())
        out = self.tokens[:, :width].clone()
        columns = torch.arange(width, device=out.device)[None, :]
        out[columns >= self.lengths[:, None]] = pad_token_id
        return out
