"""How many tokens a draft model drafts in each step: its length schedule, which the draft-model drafter owns.

Schedules, named after transformers' `GenerationConfig.num_assistant_tokens_schedule`:

- `"constant"`: always `num_assistant_tokens`.
- `"heuristic"`: transformers' assisted-generation schedule, for a whole batch: grow by 2 after a step
  in which every row accepted everything, shrink by 1 otherwise.
- `"adaptive"` (this library's default): draft up to `num_assistant_tokens`, but stop as soon as the
  next draft forward is not expected to pay (`decisions.next_draft_pays`). Drafting one more token gains, per
  row, the probability that all drafts so far *and* the next one are accepted, which the draft's own confidence
  estimates (its top probability at each position, multiplied along the chain); it costs a draft forward and one
  more verified token per row, weighed by the loop's `CostModel`.

Independently, `assistant_confidence_threshold` stops drafting once the draft's top probability falls
below the threshold in every row (transformers' rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hf_specdec.generation.decisions import CostModel, next_draft_pays

SCHEDULES = ("constant", "heuristic", "adaptive")


@dataclass
class DraftLengthPolicy:
    """A draft model's length schedule: how many tokens it drafts per step.

    Args:
        num_tokens (`int`): tokens to draft per step (the initial value for "heuristic", the most for
            "adaptive").
        schedule (`str`): `"constant"`, `"heuristic"` or `"adaptive"`.
        confidence_threshold (`float`, *optional*): stop drafting when the draft's top probability is below
            this in every row; `None` never stops on it.
        max_tokens (`int`): the most tokens the heuristic schedule may grow to.
    """

    num_tokens: int = 8
    schedule: str = "adaptive"
    confidence_threshold: float | None = None
    max_tokens: int = 16
    _current: int = field(init=False, repr=False)
    _survival: torch.Tensor | None = field(init=False, repr=False, default=None)
    _lagging: torch.Tensor | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.num_tokens, int) or isinstance(self.num_tokens, bool) or self.num_tokens < 1:
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
        """The most tokens to draft in the next step."""
        return self._current

    @property
    def adaptive(self) -> bool:
        """Whether the length follows the measured costs (then the loop may also take plain steps)."""
        return self.schedule == "adaptive"

    @property
    def may_stop(self) -> bool:
        """Whether drafting can stop before `current` tokens (then the draft's probabilities are needed)."""
        return self.adaptive or self.confidence_threshold is not None

    def start_step(self, lagging: torch.Tensor | None = None) -> None:
        """Forget the previous step's chain of confidences; `lagging` `(batch,)`: the rows whose gains count
        (the least advanced ones, see `TokenBuffer.lagging`), all by default."""
        self._survival = None
        self._lagging = lagging

    def should_stop(self, draft_probs: torch.Tensor, costs: CostModel) -> bool:
        """Whether to stop drafting after a token drafted from `draft_probs` `(batch, vocab)`, weighing the next
        draft against `costs` (the loop's)."""
        confidence = draft_probs.max(dim=-1).values  # (B,)
        if self.confidence_threshold is not None and bool((confidence < self.confidence_threshold).all()):
            return True
        if not self.adaptive:
            return False
        survival = confidence if self._survival is None else self._survival * confidence  # (B,) P(all accepted)
        self._survival = survival
        return not next_draft_pays(costs, survival * confidence, self._lagging)

    def update(self, num_drafted: int, num_accepted: list[int]) -> None:
        """Record a step: `num_drafted` tokens were drafted and row b accepted `num_accepted[b]` of them."""
        if self.schedule == "heuristic":
            if all(n == num_drafted for n in num_accepted):
                self._current = min(self._current + 2, self.max_tokens)
            else:
                self._current = max(self._current - 1, 1)
