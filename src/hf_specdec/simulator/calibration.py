"""Check the simulator against measured runs of this library.

Given what a run measured (how often the j-th draft was proposed and accepted, the draft's cost, the
target's cost curve), does the model predict the measured speedup? Two levels:

- [`calibrate`]: the closed form for a constant draft length gamma, from per-position acceptance rates;
- [`calibrate_run`]: any run, also one whose draft length varies from step to step (the adaptive
  schedule), from the run's own counts: tau = 1 + sum_j A_j / S and a step's cost
  sum_j D_j / S * c + E[V(L + 1)], with S steps, D_j the steps that drafted a j-th token, A_j those that
  accepted drafts 1..j, and L a step's draft length (P(L >= j) = D_j / S).

The second checks the cost model itself: the acceptance counts are the run's, so whatever the prediction
misses is time the model does not see (sampling, cache bookkeeping, Python between forwards, the prefill).
[`calibrate_bench`] reads `hf-specdec bench`'s `results.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from hf_specdec.simulator.closed_form import AcceptanceRates, expected_tokens, step_cost
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.validation import check_positive


class PositionCounts(Protocol):
    """What [`acceptance_from_stats`] reads: `hf_specdec.SpeculativeStats` has both counters."""

    drafted_at_position: torch.Tensor  # (max_draft_length,) steps that drafted a j-th token
    accepted_at_position: torch.Tensor  # (max_draft_length,) steps that accepted drafts 1..j


def acceptance_from_stats(stats: PositionCounts) -> tuple[float, ...]:
    """Per-position acceptance rates alpha_j = P(draft j accepted | drafts before it were), from a run's counters.

    `SpeculativeStats.accepted_at_position[j] / drafted_at_position[j]` is the probability that drafts
    1..j+1 were *all* accepted; dividing consecutive ones gives the conditional rates the closed forms take.
    The run must draft the same number of tokens every step (`num_assistant_tokens_schedule="constant"`, no
    confidence threshold): with varying lengths the closed form for one gamma does not describe it.
    """
    drafted = [int(n) for n in stats.drafted_at_position]
    accepted = [int(n) for n in stats.accepted_at_position]
    if not drafted or drafted[0] == 0:
        raise ValueError("The run drafted nothing; run speculative generate() with return_dict_in_generate=True.")
    if len(set(drafted)) != 1:
        raise ValueError(
            f"The run drafted different numbers of tokens per step (per position: {drafted}); measure with "
            "num_assistant_tokens_schedule='constant' and no assistant_confidence_threshold."
        )
    rates, previous = [], drafted[0]  # P(all before accepted), as a count; 1 before the first position
    for count in accepted:
        rates.append(count / previous if previous else 0.0)
        previous = count
    return tuple(rates)


@dataclass(frozen=True)
class CalibrationReport:
    """Predicted against measured. `relative_error` is predicted / measured - 1."""

    predicted_tau: float
    measured_tau: float | None
    predicted_speedup: float
    measured_speedup: float
    relative_error: float

    def to_dict(self) -> dict:
        return asdict(self)


def calibrate(
    alpha: AcceptanceRates,
    gamma: int,
    cost_ratio: float,
    verify_cost: CostCurve | None,
    measured_speedup: float,
    measured_tau: float | None = None,
) -> CalibrationReport:
    """Compare the closed form's speedup with a measured one.

    Args:
        alpha (`float` or sequence of `float`): measured acceptance, constant or by position (e.g. from
            [`acceptance_from_stats`]).
        gamma (`int`): the run's draft length.
        cost_ratio (`float`): measured draft forward time / target forward time (one token each).
        verify_cost (`CostCurve`, *optional*): the measured target cost curve; flat when `None`.
        measured_speedup (`float`): measured plain-decoding time / speculative time, same tokens.
        measured_tau (`float`, *optional*): the run's tokens per target forward, reported alongside.
    """
    measured_speedup = check_positive("measured_speedup", measured_speedup, "plain time / speculative time")
    tau = expected_tokens(alpha, gamma)
    speedup = tau / step_cost(gamma, cost_ratio, verify_cost)
    return CalibrationReport(tau, measured_tau, speedup, measured_speedup, speedup / measured_speedup - 1.0)


@dataclass(frozen=True)
class RunCounts:
    """What a speculative run counted, summed over rows and steps.

    Args:
        steps (`int`): S, target verification forwards (steps), summed over rows.
        drafted_at_position (`tuple[int, ...]`): D_j, steps that drafted a j-th token.
        accepted_at_position (`tuple[int, ...]`): A_j, steps that accepted drafts 1..j.
    """

    steps: int
    drafted_at_position: tuple[int, ...]
    accepted_at_position: tuple[int, ...]

    def __post_init__(self) -> None:
        drafted, accepted = self.drafted_at_position, self.accepted_at_position
        if self.steps < 1 or len(drafted) != len(accepted):
            raise ValueError("A run needs at least one step and one accepted count per drafted count.")
        if any(a > d for a, d in zip(accepted, drafted, strict=True)) or any(d > self.steps for d in drafted):
            raise ValueError("Counts are inconsistent: accepted > drafted at a position, or drafted > steps.")

    def expected_tokens(self) -> float:
        """tau: the target's own token plus the accepted drafts, per step."""
        return 1.0 + sum(self.accepted_at_position) / self.steps

    def step_cost(self, cost_ratio: float, verify_cost: CostCurve | None) -> float:
        """Mean cost of a step in target forwards: one draft forward per drafted token, one verification."""
        at_least = [self.steps, *self.drafted_at_position, 0]  # steps with L >= 0, 1, ..., max, max + 1
        curve = verify_cost or CostCurve.flat()
        verify = sum((at_least[n] - at_least[n + 1]) * curve(n + 1) for n in range(len(at_least) - 1))
        return (sum(self.drafted_at_position) * cost_ratio + verify) / self.steps


def calibrate_run(
    counts: RunCounts,
    cost_ratio: float,
    verify_cost: CostCurve | None,
    measured_speedup: float,
    measured_tau: float | None = None,
) -> CalibrationReport:
    """Compare the cost model's speedup for a run with the measured one (see the module's docstring)."""
    measured_speedup = check_positive("measured_speedup", measured_speedup, "plain time / speculative time")
    tau = counts.expected_tokens()
    speedup = tau / counts.step_cost(cost_ratio, verify_cost)
    return CalibrationReport(tau, measured_tau, speedup, measured_speedup, speedup / measured_speedup - 1.0)


def _sum_lists(lists: Sequence[Sequence[int]]) -> tuple[int, ...]:
    width = max((len(x) for x in lists), default=0)
    return tuple(sum(x[i] for x in lists if i < len(x)) for i in range(width))


def calibrate_bench(
    results: dict[str, Any], method: str = "specdec", cost_ratio: float | None = None, unit: str = "plain"
) -> CalibrationReport:
    """Calibrate against one method of an `hf-specdec bench` run (its `results.json`, loaded).

    The run must have timed the cost curve (`--cost-curve`); V(n) is its shape (normalised at n = 1).

    Args:
        results (`dict`): the loaded `results.json`.
        method (`str`): the speculative method to check.
        cost_ratio (`float`, *optional*): c; by default the run's own draft seconds per drafted token, over
            the time unit.
        unit (`str`): the time of "one target forward over one token": `"plain"`, plain decoding's time per
            token in the same run (interleaved with the method, so it shares the machine's load), or
            `"curve"`, the cost curve's one-token forward (timed separately, after the methods).
    """
    if unit not in ("plain", "curve"):
        raise ValueError(f"unit must be 'plain' or 'curve', got {unit!r}.")
    samples = [s for s in results.get("samples", []) if s["method"] == method]
    if not samples:
        raise ValueError(f"No samples of method {method!r} in these results; methods: {sorted(results['summary'])}.")
    curve_points = results.get("cost_curve_seconds") or {}
    if not curve_points:
        raise ValueError("These results have no cost curve; run the benchmark with --cost-curve.")
    curve = CostCurve.from_points({int(n): float(t) for n, t in curve_points.items()}, unit="s", source="bench")
    counts = RunCounts(
        steps=sum(sum(s["target_forwards"]) for s in samples),
        drafted_at_position=_sum_lists([s["drafted_at_position"] for s in samples]),
        accepted_at_position=_sum_lists([s["accepted_at_position"] for s in samples]),
    )
    if cost_ratio is None:
        plain = results["summary"][results["samples"][0]["method"]]  # the baseline runs first
        seconds = plain["seconds"] / plain["tokens"] if unit == "plain" else curve.times[0]
        draft_seconds = sum(s["draft_seconds"] for s in samples) / max(sum(counts.drafted_at_position), 1)
        cost_ratio = draft_seconds / seconds
    summary = results["summary"][method]
    return calibrate_run(counts, cost_ratio, curve, summary["speedup_vs_plain"], summary.get("tau"))
