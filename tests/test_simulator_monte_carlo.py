"""The Monte-Carlo simulator: the library's acceptance rules, run over many synthetic steps, agree with the
closed forms, and emit tokens that follow the target's distribution.

Every run uses a fixed seed, so the tests are deterministic. Intervals are 99% ones: a correct
implementation would miss one for about 1% of seeds per check, and these seeds pass. The distribution
checks use ALPHA = 1e-3, and a negative control shows the test rejects a wrong distribution at p < 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from hf_specdec.simulator import (
    CPU_QWEN_1_5B_BF16,
    draft_and_verify,
    expected_speedup,
    expected_tokens,
    pair_with_acceptance,
    simulate_chain,
    step_cost,
)
from hf_specdec.simulator.estimates import chi_square_test
from hf_specdec.simulator.monte_carlo import overlap

CONFIDENCE = 0.99
ALPHA = 1e-3  # reject "emitted tokens follow p" at p-value < ALPHA
POWER_ALPHA = 1e-6  # the negative control must be rejected at p-value < POWER_ALPHA


@pytest.mark.parametrize(("alpha", "gamma"), [(0.8, 4), (0.6, 3), (0.95, 8)])
def test_tau_agrees_with_the_closed_form(alpha: float, gamma: int) -> None:
    """One fixed pair at every position: acceptance is Bernoulli(sum min(p, q)) per position, independently,
    so tau must be the closed form's (1 - alpha**(gamma+1)) / (1 - alpha)."""
    pair = pair_with_acceptance(alpha, vocab_size=32, seed=1)
    assert float(overlap(*pair)) == pytest.approx(alpha, abs=1e-6)
    result = simulate_chain(gamma, pair=pair, num_steps=30_000, seed=2, confidence=CONFIDENCE, cost_ratio=0.2)
    assert result.alpha == pytest.approx(alpha, abs=1e-6)
    assert result.tau.contains(expected_tokens(alpha, gamma)), (result.tau, expected_tokens(alpha, gamma))
    assert result.speedup.contains(expected_speedup(alpha, gamma, 0.2))
    for position in result.acceptance_by_position:  # the per-position rate is alpha at every position
        assert position.contains(alpha), result.acceptance_by_position
    assert result.tau.high - result.tau.low < 0.1  # the interval is tight enough to mean something


def test_fresh_distributions_every_step_agree_with_the_closed_form() -> None:
    """p and q drawn afresh at every position: the closed form holds at alpha = E[sum min(p, q)]."""
    result = simulate_chain(5, divergence=1.0, vocab_size=64, num_steps=30_000, seed=3, confidence=CONFIDENCE)
    assert 0.5 < result.alpha < 0.9
    assert result.tau.contains(result.closed_form_tau), (result.tau, result.closed_form_tau)
    assert result.acceptance_rate.mean == pytest.approx((result.tau.mean - 1) / 5)
    assert result.emitted is None  # no single p to test the emitted tokens against


def test_greedy_agrees_with_the_closed_form() -> None:
    """Greedy accepts when argmax q == argmax p: alpha is the probability that the argmaxes agree."""
    result = simulate_chain(4, divergence=1.5, greedy=True, num_steps=30_000, seed=4, confidence=CONFIDENCE)
    assert result.tau.contains(result.closed_form_tau), (result.tau, result.closed_form_tau)
    exact = simulate_chain(4, divergence=0.0, greedy=True, num_steps=100, seed=4)
    assert exact.tau.mean == 5.0  # an exact draft: every draft and the bonus token


def test_speedup_uses_the_cost_model() -> None:
    result = simulate_chain(3, divergence=0.5, num_steps=2_000, cost_ratio=0.4, verify_cost=CPU_QWEN_1_5B_BF16)
    cost = step_cost(3, 0.4, CPU_QWEN_1_5B_BF16)
    assert result.step_cost == cost
    assert result.speedup.mean == pytest.approx(result.tau.mean / cost)
    assert result.speedup.low == pytest.approx(result.tau.low / cost)


def test_emitted_tokens_follow_the_target() -> None:
    """The first token a step emits (an accepted draft or the residual sample) must follow p; the drafted
    token itself follows q, and the same test rejects it (the negative control)."""
    p, q = pair_with_acceptance(0.6, vocab_size=16, seed=5)
    result = simulate_chain(3, pair=(p, q), num_steps=40_000, seed=6)
    assert result.emitted is not None
    assert result.emitted.p_value > ALPHA, result.emitted

    generator = torch.Generator().manual_seed(7)
    draft_tokens, num_accepted, next_token = draft_and_verify(
        p.expand(40_000, 4, 16), q.expand(40_000, 3, 16), generator
    )
    drafted = torch.bincount(draft_tokens[:, 0], minlength=16)
    assert chi_square_test(drafted, p).p_value < POWER_ALPHA
    emitted = torch.bincount(torch.where(num_accepted > 0, draft_tokens[:, 0], next_token), minlength=16)
    assert chi_square_test(emitted, p).p_value > ALPHA


def test_chi_square_matches_scipy() -> None:
    counts = torch.tensor([30, 52, 18, 100])
    probs = torch.tensor([0.15, 0.25, 0.1, 0.5])
    ours = chi_square_test(counts, probs)
    theirs = chisquare(counts.numpy(), (counts.sum() * probs).double().numpy())
    assert ours.statistic == pytest.approx(theirs.statistic)
    assert ours.p_value == pytest.approx(theirs.pvalue)


def test_invalid_monte_carlo_input() -> None:
    with pytest.raises(ValueError, match="gamma must be an integer >= 1"):
        simulate_chain(0)
    with pytest.raises(ValueError, match="divergence must be a finite number >= 0"):
        simulate_chain(2, divergence=-1.0, num_steps=10)
    with pytest.raises(ValueError, match="No draft of this family reaches"):
        pair_with_acceptance(0.001, vocab_size=4)
