"""Closed forms for a chain of drafted tokens (Leviathan et al. 2022, "Fast Inference from Transformers via
Speculative Decoding", section 3).

Notation:

    gamma   tokens drafted per step (the chain's length)
    alpha   acceptance rate; alpha_j = P(the j-th draft is accepted | drafts 1..j-1 were accepted)
    c       cost of one draft forward, in target forwards over one token
    V(n)    cost of one target forward over n tokens, relative to n = 1 (a `CostCurve`; 1 for every n in
            the paper)

A step drafts gamma tokens (gamma draft forwards), verifies them in one target forward over gamma + 1
tokens, and emits the accepted prefix plus one token from the target (a correction or a bonus). So

    tau     = 1 + sum_{j=1..gamma} prod_{i<=j} alpha_i          = (1 - alpha**(gamma+1)) / (1 - alpha)
    speedup = tau / (gamma * c + V(gamma + 1))                   = tau / (gamma * c + 1)

where the right-hand sides are the paper's constant-alpha, flat-cost special cases (its equations 1 and 2,
in expectation over i.i.d. acceptances). Speedup is against plain decoding, which emits one token per
target forward over one token.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.validation import (
    check_draft_length,
    check_nonnegative,
    check_probabilities,
    check_probability,
)

AcceptanceRates = float | Sequence[float]
"""One acceptance rate for every position, or alpha_1, alpha_2, ... by draft position."""


def acceptance_by_position(alpha: AcceptanceRates, gamma: int) -> tuple[float, ...]:
    """The per-position acceptance rates alpha_1..alpha_gamma.

    Args:
        alpha (`float` or sequence of `float`): one rate for every position, or one per position; a sequence
            needs at least `gamma` entries (extra ones are ignored, so one measured curve serves every gamma).
        gamma (`int`): the draft length.

    Returns:
        `tuple[float, ...]` of length `gamma`.
    """
    gamma = check_draft_length(gamma)
    if isinstance(alpha, Real):
        return (check_probability("alpha", alpha),) * gamma
    rates = check_probabilities("alpha", alpha)
    if len(rates) < gamma:
        raise ValueError(
            f"{len(rates)} per-position acceptance rates cannot describe a draft of {gamma} tokens; pass at "
            f"least {gamma} rates, or one float for every position."
        )
    return rates[:gamma]


def expected_tokens(alpha: AcceptanceRates, gamma: int) -> float:
    """Expected tokens emitted per target forward (tau): accepted drafts plus the target's own token.

    Args:
        alpha (`float` or sequence of `float`): acceptance rate, constant or by position (see
            [`acceptance_by_position`]).
        gamma (`int`): tokens drafted per step.

    Returns:
        `float` in [1, gamma + 1].
    """
    if isinstance(alpha, Real):
        a = check_probability("alpha", alpha)
        gamma = check_draft_length(gamma)
        if a == 1.0:  # the geometric sum's limit: every draft is accepted
            return float(gamma + 1)
        return (1.0 - a ** (gamma + 1)) / (1.0 - a)
    tau, survival = 1.0, 1.0
    for a in acceptance_by_position(alpha, gamma):
        survival *= a  # P(drafts 1..j all accepted)
        tau += survival
    return tau


def step_cost(
    gamma: int, cost_ratio: float, verify_cost: CostCurve | None = None, draft_forwards: int | None = None
) -> float:
    """Cost of one speculative step in target forwards over one token: drafting plus one verification.

    Args:
        gamma (`int`): tokens drafted, so `gamma + 1` tokens are verified.
        cost_ratio (`float`): c, one draft forward's cost in target forwards.
        verify_cost (`CostCurve`, *optional*): V(n); `None` is the paper's flat V(n) = 1.
        draft_forwards (`int`, *optional*): draft forwards per step; `gamma` (one per token of a chain) when
            `None`. A tree drafts one level per forward, so it passes its depth.
    """
    gamma = check_draft_length(gamma)
    c = check_nonnegative("cost_ratio", cost_ratio, "a draft forward's cost in target forwards")
    forwards = gamma if draft_forwards is None else check_draft_length(draft_forwards)
    verify = (verify_cost or CostCurve.flat())(gamma + 1)
    return forwards * c + verify


def expected_speedup(
    alpha: AcceptanceRates, gamma: int, cost_ratio: float, verify_cost: CostCurve | None = None
) -> float:
    """Expected speedup of a chain of `gamma` drafts over plain decoding: tau / step cost.

    Args:
        alpha (`float` or sequence of `float`): acceptance rate, constant or by position.
        gamma (`int`): tokens drafted per step.
        cost_ratio (`float`): c, one draft forward's cost in target forwards.
        verify_cost (`CostCurve`, *optional*): V(n); `None` is the paper's flat V(n) = 1.

    Example: alpha 0.8, gamma 4, c 0.2 gives (1 - 0.8**5) / ((1 - 0.8) * (4 * 0.2 + 1)) = 1.8676.
    """
    return expected_tokens(alpha, gamma) / step_cost(gamma, cost_ratio, verify_cost)


def alpha_from_tau(tau: float, gamma: int) -> float:
    """The constant acceptance rate that gives `tau` tokens per forward with `gamma` drafts (the inverse of
    [`expected_tokens`]); for reading a published tau as an acceptance rate.
    """
    gamma = check_draft_length(gamma, minimum=1)
    if not 1.0 <= tau <= gamma + 1:
        raise ValueError(f"tau must lie in [1, gamma + 1] = [1, {gamma + 1}] for gamma {gamma}, got {tau!r}.")
    low, high = 0.0, 1.0
    for _ in range(60):  # expected_tokens is increasing in alpha; bisect to float precision
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens(mid, gamma) < tau else (low, mid)
    return (low + high) / 2
