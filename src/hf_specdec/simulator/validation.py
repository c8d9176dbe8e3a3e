"""Input checks shared by the simulator, with errors that say what to pass instead."""

from __future__ import annotations

import math
from collections.abc import Sequence


def check_probability(name: str, value: float) -> float:
    """Return `value` as a float, or raise `ValueError` unless it is a probability in [0, 1]."""
    value = float(value)
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(
            f"{name} must be a probability in [0, 1], got {value!r}. An acceptance rate is the share of drafted "
            "tokens the target accepts (0.8 means 80%), not a percentage."
        )
    return value


def check_probabilities(name: str, values: Sequence[float]) -> tuple[float, ...]:
    """Check every entry of `values` with [`check_probability`]."""
    return tuple(check_probability(f"{name}[{i}]", v) for i, v in enumerate(values))


def check_nonnegative(name: str, value: float, meaning: str) -> float:
    """Return `value` as a float, or raise `ValueError` unless it is finite and >= 0.

    `meaning` completes the message ("a draft forward's cost in target forwards", ...).
    """
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0 ({meaning}), got {value!r}.")
    return value


def check_positive(name: str, value: float, meaning: str) -> float:
    """Return `value` as a float, or raise `ValueError` unless it is finite and > 0."""
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be a finite number > 0 ({meaning}), got {value!r}.")
    return value


def check_draft_length(gamma: int, minimum: int = 0) -> int:
    """Return `gamma`, or raise `ValueError` unless it is an integer >= `minimum`."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < minimum:
        raise ValueError(
            f"The draft length gamma must be an integer >= {minimum} (tokens drafted per step), got {gamma!r}."
        )
    return gamma
