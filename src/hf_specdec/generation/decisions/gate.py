"""Whether a step drafts at all: `SpeculationGate`.

A drafter's step advances the batch's least advanced row by `g` tokens (a batched call ends with its last row, so
rows ahead of it finishing sooner barely shortens it) and costs `C` plain steps of the same rows. When `g` falls
below `C` on average over recent steps (`LEAST_STEP_RATE`: drafting brought less than plain steps would have),
the loop takes plain one-token steps instead, and tries drafting again after a while (sooner when it last paid),
since what drafts bring changes with the text (a reply that starts quoting its prompt) and what verification
costs changes with the rows left in the batch. The drafter still follows the text during plain steps (prompt
lookup indexes it, a draft model catches up at its next draft), and a drafter whose proposals cost no forward
(prompt lookup beside a draft model or heads: `FreeProposals`) may still propose during the wait. Each batch size
starts with a plain step, measured: every cost is in plain steps of the same rows, and until a step has verified
drafts, verifying them is priced against it (`CostModel.verify_cost`), so that the first steps of a wide batch
do not verify more than they can pay for.
"""

from __future__ import annotations

from hf_specdec.generation.decisions.constants import FIRST_PATIENCE, LEAST_STEP_RATE, MOST_PATIENCE
from hf_specdec.generation.decisions.costs import CostModel


class SpeculationGate:
    """Decides, step by step, whether to draft or to take a plain one-token step (see the module's docstring).

    Args:
        costs (`CostModel`): the loop's cost model.
        enabled (`bool`): when `False`, every step drafts (the gate only measures).
    """

    def __init__(self, costs: CostModel, enabled: bool = True) -> None:
        self.costs = costs
        self.enabled = enabled
        self._patience = FIRST_PATIENCE
        self._wait = 0  # plain steps left before drafting again
        self.measuring = False  # whether the step `speculate` kept plain is there to measure a plain step

    def speculate(self, rows: int) -> bool:
        """Whether the next step of `rows` rows drafts (else the loop verifies each row's last token alone)."""
        explore = self.enabled and not self.costs.knows_plain(rows)
        self.measuring = explore
        if self._wait > 0 or explore:  # explore: measure a plain step of these rows before drafting
            self._wait = max(self._wait - 1, 0)
            return False
        return True

    def observe(
        self,
        gained: float,
        seconds: float,
        draft_forwards: int,
        rows: int,
        verified_per_row: int,
        verify_seconds: float,
        free: bool = False,
    ) -> None:
        """Record a step: the least advanced row gained `gained` tokens; the step (drafting, verification and the
        loop's work) took `seconds`, with `draft_forwards` draft forwards and `verified_per_row` tokens verified
        per row, of which `verify_seconds` verifying. A step in which no row drafted (the gate's plain steps, or
        a drafter that found nothing) is a plain step: it measures what plain steps take. A `free` step (drafts
        that cost no drafter forward, taken while the gate keeps steps plain) counts toward the rate drafts must
        beat but not toward the rate the gate judges drafting by, and leaves the wait as it is: it was not the
        gate's to judge."""
        if verified_per_row <= 1:
            self.costs.observe_plain(seconds, rows)
            self.costs.observe_step(gained, 1.0, speculative=False)
            return
        cost = self.costs.in_plain_steps(seconds, draft_forwards, rows, verified_per_row, verify_seconds)
        self.costs.observe_step(gained, cost, speculative=not free)  # a free step counts toward `rate` only
        if free:
            return
        step_rate = self.costs.step_rate
        assert step_rate is not None
        if step_rate >= LEAST_STEP_RATE or not self.enabled:
            self._patience = FIRST_PATIENCE
        else:  # drafting lost: plain steps for a while, and longer each time it loses again
            self._wait = self._patience
            self._patience = min(2 * self._patience, MOST_PATIENCE)
