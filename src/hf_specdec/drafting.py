"""What the speculative decoding loop asks of a drafter, whatever proposes the tokens.

Two drafters implement it: `DraftModelDrafter` (a smaller causal LM, `generate(assistant=...)`) and
`PromptLookupDrafter` (n-gram matches in each row's own tokens, `generate(prompt_lookup_num_tokens=...)`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from hf_specdec.draft_length import DraftLengthPolicy
from hf_specdec.sequences import TokenBuffer


class Proposal(NamedTuple):
    """One step's drafted tokens for every active row.

    Attributes:
        tokens (`torch.LongTensor` of shape `(active, k)`): the drafted tokens, on the buffer's device.
        q (`torch.Tensor` of shape `(active, k, vocab)`, *optional*): when sampling, the distributions the drafts
            were drawn from; `None` for greedy decoding, and for drafters that propose with certainty (q is
            then 1 on the drafted token), whose verification needs no q.
        lengths (`torch.LongTensor` of shape `(active,)`, *optional*): how many of the k tokens each row really
            drafted, when rows draft different numbers; the rest is filler that is never accepted. `None`: all k.
        forwards (`int`): how many draft-model forward passes the proposal took (0 for a lookup).
        source (`str`): `"model"` (a draft model) or `"lookup"` (prompt lookup).
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    forwards: int = 0
    source: str = "model"


class Drafter(Protocol):
    """Proposes tokens for the target to verify, and follows what the target committed."""

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """See the prompts `(batch, prompt)`: which tokens are real (`valid`) and their logical positions."""

    def start(self, first_token: torch.Tensor) -> None:
        """Record the target's first generated token `(batch,)`."""

    def propose(
        self, buffer: TokenBuffer, next_position: torch.Tensor, policy: DraftLengthPolicy, max_tokens: int
    ) -> Proposal:
        """Draft up to `policy.current` tokens (at most `max_tokens`) per active row and write them into
        `buffer` after each row's committed tokens (uncommitted), where the logits processors read them."""

    def commit(self, num_accepted: torch.Tensor, num_drafted: int, next_token: torch.Tensor) -> None:
        """Row b accepted `num_accepted[b]` of the `num_drafted` tokens, then the target chose `next_token[b]`."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Follow the batch when finished rows leave it (`keep`: positions in the old active order)."""
