"""Means with confidence intervals, and a chi-square goodness-of-fit test, for the Monte-Carlo simulator.

Only torch and the standard library: scipy is a test dependency, not a runtime one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

import torch


@dataclass(frozen=True)
class Estimate:
    """A Monte-Carlo mean with its confidence interval `[low, high]` (normal approximation)."""

    mean: float
    low: float
    high: float
    samples: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def scaled(self, factor: float) -> Estimate:
        """The estimate of `factor` times the quantity (`factor` > 0), e.g. tau / step cost."""
        return Estimate(self.mean * factor, self.low * factor, self.high * factor, self.samples)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence!r}.")
    return NormalDist().inv_cdf((1.0 + confidence) / 2.0)


def mean_estimate(samples: torch.Tensor, confidence: float = 0.95) -> Estimate:
    """Mean of i.i.d. `samples` `(n,)` with a normal-approximation interval: mean +- z * std / sqrt(n)."""
    n = samples.numel()
    if n < 2:
        raise ValueError(f"A confidence interval needs at least 2 samples, got {n}; simulate more steps.")
    x = samples.double()
    mean, half = float(x.mean()), _z(confidence) * float(x.std()) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)


def proportion_estimate(successes: int, trials: int, confidence: float = 0.95) -> Estimate:
    """A Bernoulli rate with its Wilson score interval (sound also near 0 and 1, where the normal one is not)."""
    if trials == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    z, rate = _z(confidence), successes / trials
    center = (rate + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials * trials))
    return Estimate(rate, max(0.0, center - half), min(1.0, center + half), trials)


@dataclass(frozen=True)
class ChiSquare:
    """A chi-square goodness-of-fit test of observed counts against a distribution."""

    statistic: float
    dof: int
    p_value: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def chi_square_test(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> ChiSquare:
    """Test whether `counts` `(V,)` were drawn from `probs` `(V,)`.

    Bins expected to hold fewer than `min_expected` samples are pooled into one, as the chi-square
    approximation needs; a pooled bin that is still too small joins the smallest regular bin.
    """
    counts, probs = counts.double().flatten(), probs.double().flatten()
    expected = counts.sum() * probs / probs.sum()  # (V,)
    small = expected < min_expected
    obs_bins = [counts[~small]]
    exp_bins = [expected[~small]]
    if small.any():
        obs_bins.append(counts[small].sum()[None])
        exp_bins.append(expected[small].sum()[None])
    observed, expect = torch.cat(obs_bins), torch.cat(exp_bins)  # (bins,)
    if expect[-1] < min_expected and expect.numel() > 1:  # fold a still-small pooled bin into the next smallest
        j = int(expect[:-1].argmin())
        observed[j] += observed[-1]
        expect[j] += expect[-1]
        observed, expect = observed[:-1], expect[:-1]
    dof = expect.numel() - 1
    if dof < 1:
        raise ValueError("Too few samples for a chi-square test: every bin would be pooled; simulate more steps.")
    statistic = float(((observed - expect) ** 2 / expect).sum())
    # P(chi2_dof > statistic) = Q(dof / 2, statistic / 2), the regularised upper incomplete gamma function
    half = torch.tensor([dof / 2, statistic / 2], dtype=torch.float64)
    p_value = float(torch.special.gammaincc(half[0], half[1]))
    return ChiSquare(statistic, dof, p_value)
