"""The draft-length policies, on synthetic timings and confidences."""

from __future__ import annotations

import pytest
import torch

from hf_specdec.draft_length import DraftLengthPolicy


def test_adaptive_costs_are_recovered_from_step_timings() -> None:
    """Target: 0.2 s for one token per row at batch 4, +0.01 s per extra verified token; draft: 0.08 s."""
    policy = DraftLengthPolicy(cost_ratio=0.3)
    for k in [2, 5, 8, 3, 6, 4, 7] * 4:
        policy.observe_costs(0.08 * k, k, 0.2 + 0.01 * (4 * (k + 1) - 4), rows=4)
    assert policy.cost_ratio == pytest.approx(0.4, abs=0.01)
    assert policy._per_token_cost == pytest.approx(0.05, abs=0.005)


def test_adaptive_stops_when_the_expected_gain_falls_below_the_cost() -> None:
    policy = DraftLengthPolicy(num_tokens=8, cost_ratio=0.4)
    probs = torch.tensor([[0.9, 0.1]])  # confidence 0.9: gains 0.81, 0.73, 0.66, 0.59, 0.53, 0.48, 0.43, 0.39
    policy.start_step()
    drafted = 1
    while not policy.should_stop(probs):
        drafted += 1
    assert drafted == 8  # the gain of a 9th draft (0.9**9 = 0.39) would be below 0.4


def test_heuristic_schedule_grows_and_shrinks() -> None:
    policy = DraftLengthPolicy(num_tokens=4, schedule="heuristic")
    policy.update(4, torch.tensor([4, 4]))
    assert policy.current == 6
    policy.update(6, torch.tensor([6, 2]))
    assert policy.current == 5


def test_confidence_threshold_stops_when_every_row_is_unsure() -> None:
    policy = DraftLengthPolicy(schedule="constant", confidence_threshold=0.5)
    policy.start_step()
    assert not policy.should_stop(torch.tensor([[0.6, 0.4], [0.3, 0.7]]))
    assert policy.should_stop(torch.tensor([[0.45, 0.55], [0.52, 0.48]]) * torch.tensor([[0.9, 0.9]]))
