"""How many tokens to draft in each step.

Schedules, named after transformers' `GenerationConfig.num_assistant_tokens_schedule`:

- `"constant"`: always `num_assistant_tokens`.
- `"heuristic"`: transformers' assisted-generation schedule, for a whole batch: grow by 2 after a step
  in which every row accepted everything, shrink by 1 otherwise.
- `"adaptive"` (this library's default): draft up to `num_assistant_tokens`, but stop as soon as the
  next draft forward is expected to cost more than it brings. Drafting one more token gains, per row,
  the probability that all drafts so far *and* the next one are accepted, which the draft's own
  confidence estimates (its top probability at each position, multiplied along the chain). It costs a
  draft forward, `c` target forwards, plus one more token per row to verify, `v` target forwards each
  (a verification forward's time grows with rows x tokens once the hardware is busy). A target forward
  is worth one token per row in plain decoding, so drafting goes on while the expected gain, averaged
  over the rows, exceeds `c + v * rows`. Both costs are measured while decoding: verification time is
  fitted as a line in the number of verified tokens, and a draft forward's time is taken relative to the
  fitted time of a one-token-per-row target forward (the draft's parameter share is the first guess of `c`).

Independently, `assistant_confidence_threshold` stops drafting once the draft's top probability falls
below the threshold in every row (transformers' rule).

Drafters with no confidence of their own (prompt lookup) use the same rule with the acceptance rate measured
at each draft position in recent steps in place of the draft's confidence (`AcceptanceHistory`), and `c = 0`.

Measured costs make the draft lengths (and, with a draft model and prompt lookup together, the choice of
drafter) depend on wall-clock timings, so a seeded sampling run may draw differently from run to run (the
distribution stays exact). Fixed costs (`SpeculativeCosts`, e.g. those an earlier run measured, returned in
`SpeculativeStats.costs`) make every decision a function of the tokens alone: with a seeded `generator`,
sampled outputs are then bitwise reproducible on a fixed machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

SCHEDULES = ("constant", "heuristic", "adaptive")

# Weight of the newest measurement in the running estimate of the draft/target cost ratio.
_COST_SMOOTHING = 0.2
# Acceptance history by draft position: per step older counts keep this weight, and each position remembers
# at most this many drafts. With no new drafts at a position its rate drifts back to the prior within a few
# dozen steps, so a drafter that stopped drafting tries again.
_HISTORY_DECAY = 0.9
_HISTORY_DRAFTS = 20.0


@dataclass(frozen=True)
class SpeculativeCosts:
    """The costs the adaptive rules weigh, in one-token target forwards (a plain decoding step).

    Pass them to `generate(..., speculative_costs=...)` to use these instead of measuring them while decoding:
    decisions then no longer depend on timings, so seeded sampling is reproducible.

    Args:
        draft_forward (`float`): `c`, one draft-model forward (ignored by prompt lookup, which runs none).
        verify_per_token (`float`): `v`, verifying one more token per row.
    """

    draft_forward: float
    verify_per_token: float

    def __post_init__(self) -> None:
        for name in ("draft_forward", "verify_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ValueError(f"SpeculativeCosts.{name} is a non-negative number of target forwards, got {value!r}.")


@dataclass
class DraftLengthPolicy:
    """Chooses the number of drafted tokens per step.

    Args:
        num_tokens (`int`): tokens to draft per step (the initial value for "heuristic", the most for
            "adaptive").
        schedule (`str`): `"constant"`, `"heuristic"` or `"adaptive"`.
        confidence_threshold (`float`, *optional*): stop drafting when the draft's top probability is below
            this in every row; `None` never stops on it.
        cost_ratio (`float`): the first estimate of a draft forward's cost in target forwards ("adaptive").
        max_tokens (`int`): the most tokens the heuristic schedule may grow to.
        costs (`SpeculativeCosts`, *optional*): fixed costs, used instead of measurements (then `cost_ratio` is
            `costs.draft_forward`).
    """

    num_tokens: int = 8
    schedule: str = "adaptive"
    confidence_threshold: float | None = None
    cost_ratio: float = 0.3
    max_tokens: int = 16
    costs: SpeculativeCosts | None = None
    _current: int = field(init=False, repr=False)
    _survival: torch.Tensor | None = field(init=False, repr=False, default=None)
    _verify: _VerifyCost = field(init=False, repr=False)
    _per_token_cost: float = field(init=False, repr=False, default=0.0)

    def __post_init__(self) -> None:
        if not isinstance(self.num_tokens, int) or isinstance(self.num_tokens, bool) or self.num_tokens < 1:
            raise ValueError(f"num_assistant_tokens must be a positive integer, got {self.num_tokens!r}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"num_assistant_tokens_schedule={self.schedule!r} is not supported; use one of {SCHEDULES}."
            )
        if self.confidence_threshold is not None and not 0.0 <= self.confidence_threshold < 1.0:
            raise ValueError(f"assistant_confidence_threshold must be in [0, 1), got {self.confidence_threshold!r}.")
        if not self.cost_ratio >= 0.0:
            raise ValueError(f"The draft's cost ratio must be non-negative, got {self.cost_ratio!r}.")
        self.max_tokens = max(self.max_tokens, self.num_tokens)
        self._current = self.num_tokens
        self._verify = _VerifyCost()
        if self.costs is not None:
            self.cost_ratio, self._per_token_cost = self.costs.draft_forward, self.costs.verify_per_token

    @classmethod
    def cost_meter(cls, num_tokens: int, costs: SpeculativeCosts | None = None) -> DraftLengthPolicy:
        """The loop's policy when no draft model drafts (prompt lookup, Medusa heads): it only measures (or
        holds fixed) what verifying one more token costs; there is no draft forward to pay for (c = 0)."""
        costs = None if costs is None else dataclasses.replace(costs, draft_forward=0.0)
        return cls(num_tokens=num_tokens, schedule="constant", cost_ratio=0.0, costs=costs)

    @property
    def estimated_costs(self) -> SpeculativeCosts:
        """The costs in use: the fixed ones, or the current estimates."""
        return self.costs or SpeculativeCosts(self.cost_ratio, self._per_token_cost)

    @property
    def current(self) -> int:
        """The most tokens to draft in the next step."""
        return self._current

    @property
    def may_stop(self) -> bool:
        """Whether drafting can stop before `current` tokens (then the draft's probabilities are needed)."""
        return self.schedule == "adaptive" or self.confidence_threshold is not None

    def start_step(self) -> None:
        """Forget the previous step's chain of confidences."""
        self._survival = None

    def should_stop(self, draft_probs: torch.Tensor) -> bool:
        """Whether to stop drafting after a token drafted from `draft_probs` `(batch, vocab)`."""
        confidence = draft_probs.max(dim=-1).values  # (B,)
        if self.confidence_threshold is not None and bool((confidence < self.confidence_threshold).all()):
            return True
        if self.schedule != "adaptive":
            return False
        survival = confidence if self._survival is None else self._survival * confidence  # (B,) P(all accepted)
        self._survival = survival
        expected_gain = float((survival * confidence).mean())  # of one more draft, in tokens per row
        return expected_gain < self.cost_ratio + self._per_token_cost * confidence.numel()

    def update(self, num_drafted: int, num_accepted: torch.Tensor) -> None:
        """Record a step: `num_drafted` tokens were drafted and row b accepted `num_accepted[b]` of them."""
        if self.schedule == "heuristic":
            if bool((num_accepted == num_drafted).all()):
                self._current = min(self._current + 2, self.max_tokens)
            else:
                self._current = max(self._current - 1, 1)

    @property
    def per_token_cost(self) -> float:
        """`v`: what verifying one more token per row costs, in one-token target forwards (measured)."""
        return self._per_token_cost

    def observe_costs(
        self,
        draft_seconds: float,
        num_draft_forwards: int,
        verify_seconds: float,
        rows: int = 1,
        verified_per_row: int | None = None,
    ) -> None:
        """Refine the cost estimates from one step's timings: `num_draft_forwards` draft forwards took
        `draft_seconds`, verifying `verified_per_row` tokens (default `num_draft_forwards + 1`) for each of `rows`
        rows took `verify_seconds`. Nothing changes with fixed `costs`."""
        if verify_seconds <= 0 or self.costs is not None:
            return
        verified = num_draft_forwards + 1 if verified_per_row is None else verified_per_row
        self._verify.add(rows * verified, verify_seconds)
        one_token, per_token = self._verify.predict(rows), self._verify.slope
        if one_token is None:  # too few different verify sizes yet: compare with the whole verification
            one_token, per_token = verify_seconds, 0.0
        self._per_token_cost = per_token / one_token
        if num_draft_forwards > 0:
            ratio = draft_seconds / num_draft_forwards / one_token
            self.cost_ratio = (1 - _COST_SMOOTHING) * self.cost_ratio + _COST_SMOOTHING * ratio


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

    def update(self, num_drafted: int, num_accepted: torch.Tensor, lengths: torch.Tensor | None = None) -> None:
        """Record a step: up to `num_drafted` tokens were drafted, row b accepted `num_accepted[b]` of them
        (`lengths[b]`: how many row b really drafted, when rows drafted different numbers)."""
        k, num_accepted = num_drafted, num_accepted.cpu()
        drafted = torch.full_like(num_accepted, k) if lengths is None else lengths.cpu()  # (A,)
        positions = torch.arange(k)[None, :]  # (1, k)
        reached = ((drafted[:, None] > positions) & (num_accepted[:, None] >= positions)).sum(0).tolist()
        accepted = (num_accepted[:, None] > positions).sum(0).tolist()
        grow = k - len(self._reached)
        if grow > 0:
            self._reached += [0.0] * grow
            self._accepted += [0.0] * grow
        self._reached = [_HISTORY_DECAY * r for r in self._reached]
        self._accepted = [_HISTORY_DECAY * a for a in self._accepted]
        for j in range(k):
            self._reached[j] += reached[j]
            self._accepted[j] += accepted[j]
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

    def expected_tokens(self, lengths: list[int]) -> float:
        """Expected committed tokens per row of a step in which row b drafts `lengths[b]` tokens: one from the
        target plus, per drafted position, the chance that it and every earlier draft are accepted."""
        total = 0.0
        for length in lengths:
            survival = 1.0
            total += 1.0
            for position in range(length):
                survival *= self.acceptance_rate(position)
                total += survival
        return total / max(len(lengths), 1)

    def planned_length(self, max_tokens: int, cost: float) -> int:
        """The adaptive rule on measured rates: draft up to `max_tokens`, while the expected gain of the next
        draft (the product of the rates up to it) is at least `cost` (`c + v * rows`, in tokens per row)."""
        survival, length = 1.0, 0
        for position in range(max_tokens):
            survival *= self.acceptance_rate(position)
            if survival < cost:
                break
            length = position + 1
        return length


class _VerifyCost:
    """Verification time as a line in the number of verified tokens, fitted by exponentially weighted
    least squares (recent steps count more: the machine's load drifts)."""

    _DECAY = 0.9

    def __init__(self) -> None:
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        d = self._DECAY
        self._w = d * self._w + 1.0
        self._x = d * self._x + tokens
        self._y = d * self._y + seconds
        self._xx = d * self._xx + tokens * tokens
        self._xy = d * self._xy + tokens * seconds

    @property
    def slope(self) -> float:
        variance = self._xx / self._w - (self._x / self._w) ** 2
        if variance <= 1e-9:
            return 0.0
        covariance = self._xy / self._w - (self._x / self._w) * (self._y / self._w)
        return max(covariance / variance, 0.0)

    def predict(self, tokens: int) -> float | None:
        """Fitted seconds for `tokens` verified tokens, or `None` before two different sizes were seen."""
        if self._w == 0.0 or self._xx / self._w - (self._x / self._w) ** 2 <= 1e-9:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        fitted = mean_y + self.slope * (tokens - mean_x)
        return fitted if fitted > 0 else None
