"""How many tokens to draft in each step.

Schedules, named after transformers' `GenerationConfig.num_assistant_tokens_schedule`:

- `"constant"`: always `num_assistant_tokens`.
- `"heuristic"`: transformers' assisted-generation schedule, for a whole batch: grow by 2 after a step
  in which every row accepted everything, shrink by 1 otherwise.
- `"adaptive"` (this library's default): draft up to `num_assistant_tokens`, but stop as soon as the
  next draft forward is expected to bring less than it costs at the rate recent steps brought. Drafting one
  more token gains, per row, the probability that all drafts so far *and* the next one are accepted, which
  the draft's own confidence estimates (its top probability at each position, multiplied along the chain). It costs a
  draft forward, `c` target forwards, plus one more token per row to verify, `v` target forwards each
  (a verification forward's time grows with rows x tokens once the hardware is busy). That time could go to
  steps like the recent ones, which brought `rate` tokens per row per target forward's worth of time (at least
  1, what plain decoding brings), so drafting goes on while the expected gain is at least `rate * (c + v *
  rows)` (`CostModel.draft_threshold`: the rule that maximises tokens per second, see
  `hf_specdec.generation.cost_model`); in a batch, the gain of the least advanced rows (averaged over them): the
  call ends with its last row, so tokens for rows ahead of it barely shorten it. The costs and the rate come
  from the loop's `CostModel` (measured while decoding, the draft's parameter share the first guess of `c`, or
  fixed).

Independently, `assistant_confidence_threshold` stops drafting once the draft's top probability falls
below the threshold in every row (transformers' rule).

Drafters with no confidence of their own (prompt lookup) use the same rule with the acceptance rate measured
at each draft position in recent steps in place of the draft's confidence (`AcceptanceHistory`), and `c = 0`
(`CostModel.verify_threshold`).

Measured costs make the draft lengths (and, with a draft model and prompt lookup together, the choice of
drafter) depend on wall-clock timings; fixed ones (`SpeculativeCosts`) make them a function of the tokens alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hf_specdec.generation.cost_model import CostModel, SpeculativeCosts

SCHEDULES = ("constant", "heuristic", "adaptive")

# Acceptance history by draft position: per step older counts keep this weight, and each position remembers
# at most this many drafts. With no new drafts at a position its rate drifts back to the prior within a few
# dozen steps, so a drafter that stopped drafting tries again.
_HISTORY_DECAY = 0.9
_HISTORY_DRAFTS = 20.0


@dataclass
class DraftLengthPolicy:
    """Chooses the number of drafted tokens per step.

    Args:
        num_tokens (`int`): tokens to draft per step (the initial value for "heuristic", the most for
            "adaptive").
        schedule (`str`): `"constant"`, `"heuristic"` or `"adaptive"`.
        confidence_threshold (`float`, *optional*): stop drafting when the draft's top probability is below
            this in every row; `None` never stops on it.
        cost_ratio (`float`): the first estimate of a draft forward's cost in target forwards (`c`).
        max_tokens (`int`): the most tokens the heuristic schedule may grow to.
        costs (`SpeculativeCosts`, *optional*): fixed costs, used instead of measurements (then `cost_ratio` is
            `costs.draft_forward`).

    Attributes:
        cost_model (`CostModel`): the costs the adaptive rules weigh, measured or fixed; the loop measures them.
    """

    num_tokens: int = 8
    schedule: str = "adaptive"
    confidence_threshold: float | None = None
    cost_ratio: float = 0.3
    max_tokens: int = 16
    costs: SpeculativeCosts | None = None
    _current: int = field(init=False, repr=False)
    _survival: torch.Tensor | None = field(init=False, repr=False, default=None)
    _lagging: torch.Tensor | None = field(init=False, repr=False, default=None)
    cost_model: CostModel = field(init=False, repr=False)

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
        self.cost_model = CostModel(self.cost_ratio, self.costs)

    @classmethod
    def cost_meter(cls, num_tokens: int, costs: SpeculativeCosts | None = None) -> DraftLengthPolicy:
        """The loop's policy when no draft model drafts (prompt lookup, Medusa heads): its cost model measures
        (or holds fixed) what verifying one more token costs; there is no draft forward to pay for (c = 0)."""
        costs = None if costs is None else SpeculativeCosts(0.0, costs.verify_per_token)
        return cls(num_tokens=num_tokens, schedule="constant", cost_ratio=0.0, costs=costs)

    @property
    def current(self) -> int:
        """The most tokens to draft in the next step."""
        return self._current

    @property
    def may_stop(self) -> bool:
        """Whether drafting can stop before `current` tokens (then the draft's probabilities are needed)."""
        return self.schedule == "adaptive" or self.confidence_threshold is not None

    def start_step(self, lagging: torch.Tensor | None = None) -> None:
        """Forget the previous step's chain of confidences; `lagging` `(batch,)`: the rows whose gains count
        (the least advanced ones, see `TokenBuffer.lagging`), all by default."""
        self._survival = None
        self._lagging = lagging

    def should_stop(self, draft_probs: torch.Tensor) -> bool:
        """Whether to stop drafting after a token drafted from `draft_probs` `(batch, vocab)`."""
        confidence = draft_probs.max(dim=-1).values  # (B,)
        if self.confidence_threshold is not None and bool((confidence < self.confidence_threshold).all()):
            return True
        if self.schedule != "adaptive":
            return False
        survival = confidence if self._survival is None else self._survival * confidence  # (B,) P(all accepted)
        self._survival = survival
        gains = survival * confidence  # (B,) of one more draft, in tokens
        if self._lagging is None:
            expected_gain = float(gains.mean())  # the one read per draft forward
        else:
            lagging = self._lagging.to(gains.dtype)
            expected_gain = float((gains * lagging).sum() / lagging.sum())
        return expected_gain < self.cost_model.draft_threshold(confidence.numel())

    def update(self, num_drafted: int, num_accepted: list[int]) -> None:
        """Record a step: `num_drafted` tokens were drafted and row b accepted `num_accepted[b]` of them."""
        if self.schedule == "heuristic":
            if all(n == num_drafted for n in num_accepted):
                self._current = min(self._current + 2, self.max_tokens)
            else:
                self._current = max(self._current - 1, 1)


class AcceptanceHistory:
    """How often drafts were accepted at each draft position in recent steps, for a drafter with no confidence
    of its own (prompt lookup): the share of drafts at position j accepted when every earlier one was.

    Args:
        prior (`float`): the rate assumed at a position before any draft there is measured (worth two drafts).
    """

    def __init__(self, prior: float = 0.5) -> None:
        self.prior = prior
        self._reached: list[float] = []  # per position: drafts whose earlier drafts were all accepted
        self._accepted: list[float] = []  # per position: of those, accepted

    def update(self, num_drafted: int, num_accepted: list[int], lengths: list[int] | None = None) -> None:
        """Record a step: up to `num_drafted` tokens were drafted, row b accepted `num_accepted[b]` of them
        (`lengths[b]`: how many row b really drafted, when rows drafted different numbers)."""
        k = num_drafted
        drafted = [k] * len(num_accepted) if lengths is None else lengths
        grow = k - len(self._reached)
        if grow > 0:
            self._reached += [0.0] * grow
            self._accepted += [0.0] * grow
        self._reached = [_HISTORY_DECAY * r for r in self._reached]
        self._accepted = [_HISTORY_DECAY * a for a in self._accepted]
        for j in range(k):
            self._reached[j] += sum(1 for d, a in zip(drafted, num_accepted, strict=True) if d > j and a >= j)
            self._accepted[j] += sum(1 for a in num_accepted if a > j)
            if self._reached[j] > _HISTORY_DRAFTS:
                scale = _HISTORY_DRAFTS / self._reached[j]
                self._reached[j] *= scale
                self._accepted[j] *= scale

    def acceptance_rate(self, position: int) -> float:
        """Recent share of drafts at `position` (0-based) accepted when every earlier draft was, with the prior
        counted as two drafts accepted at `prior`."""
        if position >= len(self._reached):
            return self.prior
        return (self._accepted[position] + 2.0 * self.prior) / (self._reached[position] + 2.0)

    def survival(self, length: int) -> list[float]:
        """The chance that drafts 1..j are all accepted, for j = 1..`length`: the products of the rates."""
        curve, survival = [], 1.0
        for position in range(length):
            survival *= self.acceptance_rate(position)
            curve.append(survival)
        return curve

    def expected_tokens(self, lengths: list[int]) -> float:
        """Expected committed tokens per row of a step in which row b drafts `lengths[b]` tokens: one from the
        target plus, per drafted position, the chance that it and every earlier draft are accepted."""
        total = sum(1.0 + sum(self.survival(length)) for length in lengths)
        return total / max(len(lengths), 1)


def shared_width(survivals: list[list[float]], cost: float) -> int:
    """How many tokens per row a batch should verify, when row b's j-th draft would be accepted (with all
    earlier ones) with chance `survivals[b][j]` and every row is verified to the same width (shorter rows are
    padded, and padding costs as much as drafts): widen while one more position is expected to bring, averaged
    over the rows given (those whose gains count: the least advanced, see `TokenBuffer.lagging`), at least
    `cost` tokens (`CostModel.verify_threshold`: `v * rows` plain steps per position, at the rate recent steps
    brought)."""
    rows, width = max(len(survivals), 1), 0
    for position in range(max((len(curve) for curve in survivals), default=0)):
        gain = sum(curve[position] for curve in survivals if len(curve) > position) / rows
        if gain < cost:
            break
        width = position + 1
    return width
