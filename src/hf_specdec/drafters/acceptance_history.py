"""How often a drafter with no confidence of its own (prompt lookup) was right, by draft position: the gain
estimates its adaptive width weighs (`decisions.shared_width`)."""

from __future__ import annotations

from hf_specdec.generation.decisions.constants import HISTORY_DECAY, HISTORY_DRAFTS, PRIOR_ACCEPTANCE, PRIOR_DRAFTS


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
        self._reached = [HISTORY_DECAY * r for r in self._reached]
        self._accepted = [HISTORY_DECAY * a for a in self._accepted]
        for j in range(k):
            self._reached[j] += sum(1 for d, a in zip(drafted, num_accepted, strict=True) if d > j and a >= j)
            self._accepted[j] += sum(1 for a in num_accepted if a > j)
            if self._reached[j] > HISTORY_DRAFTS:
                scale = HISTORY_DRAFTS / self._reached[j]
                self._reached[j] *= scale
                self._accepted[j] *= scale

    def acceptance_rate(self, position: int) -> float:
        """Recent share of drafts at `position` (0-based) accepted when every earlier draft was, with the prior
        counted as two drafts accepted at `prior`."""
        if position >= len(self._reached):
            return self.prior
        return (self._accepted[position] + PRIOR_DRAFTS * self.prior) / (self._reached[position] + PRIOR_DRAFTS)

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


class HistoryByMatchSize(dict[int, AcceptanceHistory]):
    """Acceptance by draft position for each matched n-gram size, made at a size's first use (starting from its
    prior, `PRIOR_ACCEPTANCE`), so that a large `max_matching_ngram_size` costs nothing until matches that long
    occur."""

    def __missing__(self, n: int) -> AcceptanceHistory:
        history = self[n] = AcceptanceHistory(PRIOR_ACCEPTANCE[min(n, max(PRIOR_ACCEPTANCE))])
        return history
