"""The draft-length policies, on synthetic timings and confidences."""

from __future__ import annotations

import pytest
import torch

from hf_specdec.drafters.acceptance_history import AcceptanceHistory
from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.generation.decisions import CostModel, shared_width


def test_adaptive_stops_when_the_expected_gain_falls_below_the_cost() -> None:
    policy, costs = DraftLengthPolicy(num_tokens=8), CostModel(draft_forward=0.4)
    probs = torch.tensor([[0.9, 0.1]])  # confidence 0.9: gains 0.81, 0.73, 0.66, 0.59, 0.53, 0.48, 0.43, 0.39
    policy.start_step()
    drafted = 1
    while not policy.should_stop(probs, costs):
        drafted += 1
    assert drafted == 8  # the gain of a 9th draft (0.9**9 = 0.39) would be below 0.4


def test_heuristic_schedule_grows_and_shrinks() -> None:
    policy = DraftLengthPolicy(num_tokens=4, schedule="heuristic")
    policy.update(4, torch.tensor([4, 4]))
    assert policy.current == 6
    policy.update(6, torch.tensor([6, 2]))
    assert policy.current == 5


def test_confidence_threshold_stops_when_every_row_is_unsure() -> None:
    policy, costs = DraftLengthPolicy(schedule="constant", confidence_threshold=0.5), CostModel()
    policy.start_step()
    assert not policy.should_stop(torch.tensor([[0.6, 0.4], [0.3, 0.7]]), costs)
    assert policy.should_stop(torch.tensor([[0.45, 0.55], [0.52, 0.48]]) * torch.tensor([[0.9, 0.9]]), costs)


def _planned(history: AcceptanceHistory, max_tokens: int, cost: float) -> int:
    """One row's draft length under the adaptive rule on measured rates."""
    return shared_width([history.survival(max_tokens)], None, cost)


def test_planned_length_follows_the_measured_acceptance_by_position() -> None:
    """Without a draft confidence (prompt lookup), the rule runs on the acceptance rates measured at each
    position: 0.9, then 5/9, then 1/5 given the earlier ones (a little closer to 1/2 with the prior), so
    expected gains of about 0.86, 0.47 and 0.11."""
    history = AcceptanceHistory()
    assert _planned(history, 6, cost=0.0) == 6  # no history and free verification: the prior (1/2) pays
    for _ in range(200):  # 10 rows drafting 3 tokens: 1 accepts none, 4 accept one, 4 two, 1 all three
        history.update(3, torch.tensor([0, 1, 1, 1, 1, 2, 2, 2, 2, 3]))
    assert [history.acceptance_rate(j) for j in range(3)] == pytest.approx([0.86, 0.55, 0.23], abs=0.01)
    assert _planned(history, 6, cost=0.0) == 6  # per-token cost 0: every position with a gain pays
    # Verification: 0.2 s for one token per row at batch 4, 0.012 s per extra token: v = 0.06 per token-row.
    costs = CostModel(draft_forward=0.0)
    for k in [0, 3, 1, 5, 2] * 4:
        costs.observe(0.0, 0, 0.2 + 0.012 * (4 * (k + 1) - 4), rows=4, verified_per_row=k + 1)
    assert costs.draft_forward == 0.0  # no draft forwards: nothing to learn about their cost
    v = costs.verify_per_token
    assert _planned(history, 6, cost=4 * v) == 2  # gains 0.86, 0.47 pay for 4 * 0.06; the third (0.11) does not
    # One row: 0.11 pays for 0.06; a 4th draft, never measured, would gain 0.11 * 1/2 (the prior): too little.
    assert _planned(history, 6, cost=v) == 3


def test_planned_length_returns_to_drafting_after_stopping() -> None:
    """A drafter that stopped (every position too unlikely) must not stop forever: old counts fade."""
    history = AcceptanceHistory()
    for _ in range(50):
        history.update(4, torch.zeros(8, dtype=torch.long))
    assert _planned(history, 4, cost=0.3) == 0
    for _ in range(60):
        history.update(0, torch.zeros(8, dtype=torch.long))
    assert _planned(history, 4, cost=0.3) >= 1


def test_prior_acceptance_sets_the_rate_before_any_measurement() -> None:
    history = AcceptanceHistory(prior=0.8)
    assert history.acceptance_rate(0) == 0.8
    assert history.expected_tokens([2]) == pytest.approx(1 + 0.8 + 0.64)
    history.update(1, torch.zeros(2, dtype=torch.long))  # two rejections: (0 + 1.6) / (2 + 2)
    assert history.acceptance_rate(0) == pytest.approx(0.4)


def test_shared_width_weighs_every_rows_gain_against_the_whole_batchs_cost() -> None:
    """Every row is verified to the same width: one row's good match widens the batch only while its gain,
    averaged over all rows (the others pad), pays for `v * rows`."""
    assert shared_width([[0.9, 0.5, 0.2]], None, cost=0.3) == 2  # one row: its own rule
    assert shared_width([[0.9, 0.5, 0.2], [], [], []], None, cost=0.2) == 1  # 0.9 / 4 pays, 0.5 / 4 does not
    assert shared_width([[0.9, 0.5, 0.2], [0.8, 0.6], [0.9], []], None, cost=0.2) == 2  # (0.5 + 0.6) / 4 pays
    assert shared_width([[], []], None, cost=0.0) == 0  # nothing matched
    # Only the least advanced rows' gains count: here the second row alone, whose 0.6 pays for 0.5.
    assert shared_width([[0.9, 0.5, 0.2], [0.8, 0.6]], [False, True], cost=0.5) == 2


def test_adaptive_weighs_what_drafts_bring_the_least_advanced_rows() -> None:
    """Row 0 is sure (0.95), row 1 is not (0.5); drafting one more costs 0.4. Averaged over both rows another
    draft pays (0.575); if only row 1 lags (the call ends with it) it does not (0.25); if only row 0, it does."""
    probs = torch.tensor([[0.95, 0.05], [0.5, 0.5]])
    decisions = []
    for lagging in (None, torch.tensor([False, True]), torch.tensor([True, False])):
        policy = DraftLengthPolicy(num_tokens=8)
        policy.start_step(lagging)
        decisions.append(policy.should_stop(probs, CostModel(draft_forward=0.4)))
    assert decisions == [False, True, False]
