"""How many tokens to draft in the next step.

Two policies, named as in transformers' `GenerationConfig.num_assistant_tokens_schedule`:

- `"constant"`: always `num_assistant_tokens`.
- `"heuristic"`: grow by 2 after a step in which every row accepted everything, shrink by 1 otherwise
  (transformers' assisted-generation schedule, applied to a whole batch).

Independently, `assistant_confidence_threshold` stops drafting early in a step once the draft's top
probability falls below the threshold in every active row: a draft that is unsure is usually wrong, and
each draft forward costs time on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCHEDULES = ("constant", "heuristic")


@dataclass
class DraftLengthPolicy:
    """Chooses the number of drafted tokens per step from the acceptance history.

    Args:
        num_tokens (`int`): the (initial) number of tokens to draft per step.
        schedule (`str`): `"constant"` or `"heuristic"`.
        confidence_threshold (`float`, *optional*): stop drafting when the draft's top probability is below
            this in every row; `None` never stops early.
        max_tokens (`int`): the most tokens the heuristic schedule may grow to.
    """

    num_tokens: int = 6
    schedule: str = "constant"
    confidence_threshold: float | None = None
    max_tokens: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.num_tokens, int) or self.num_tokens < 1:
            raise ValueError(f"num_assistant_tokens must be a positive integer, got {self.num_tokens!r}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"num_assistant_tokens_schedule={self.schedule!r} is not supported; use one of {SCHEDULES}."
            )
        if self.confidence_threshold is not None and not 0.0 <= self.confidence_threshold < 1.0:
            raise ValueError(f"assistant_confidence_threshold must be in [0, 1), got {self.confidence_threshold!r}.")
        self.max_tokens = max(self.max_tokens, self.num_tokens)
        self._current = self.num_tokens

    @property
    def current(self) -> int:
        """The number of tokens to draft in the next step."""
        return self._current

    def should_stop(self, draft_probs: torch.Tensor) -> bool:
        """Whether to stop drafting after a token whose draft probabilities are `draft_probs` `(batch, vocab)`."""
        if self.confidence_threshold is None:
            return False
        return bool((draft_probs.max(dim=-1).values < self.confidence_threshold).all())

    def update(self, num_drafted: int, num_accepted: torch.Tensor) -> None:
        """Record a step: `num_drafted` tokens were drafted and row b accepted `num_accepted[b]` of them."""
        if self.schedule == "heuristic":
            if bool((num_accepted == num_drafted).all()):
                self._current = min(self._current + 2, self.max_tokens)
            else:
                self._current = max(self._current - 1, 1)
