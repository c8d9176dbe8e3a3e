"""Check the simulator against reality: measured runs of this library, and published results.

Two questions:

1. Given what a benchmark measured (acceptance by draft position, the draft/target cost ratio, the
   target's cost curve), does the closed form predict the measured speedup? [`calibrate`] reports the
   relative error.
2. Given a published tau and speedup, what must a step have cost? A step that emits tau tokens for the
   price of `tau / speedup` plain forwards; whatever of that cost a model (drafting, verification on the
   roofline) does not explain is overhead of the implementation. [`explain_published`] splits it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hf_specdec.outputs import SpeculativeStats
from hf_specdec.simulator.closed_form import AcceptanceRates, expected_tokens, step_cost
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.validation import check_positive


def acceptance_from_stats(stats: SpeculativeStats) -> tuple[float, ...]:
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
class PublishedResult:
    """A published tau (mean accepted tokens per step, counting the target's own token) and speedup."""

    method: str
    tau: float
    speedup: float
    source: str = ""


_LEADERBOARD = "Spec-Bench Leaderboard.md, A100 80GB, Vicuna-7B-v1.3, greedy, fp16, batch 1 (commit 5544fd7)"
SPEC_BENCH_A100_VICUNA_7B = {
    r.method: r
    for r in (
        PublishedResult("eagle", 3.61, 2.29, _LEADERBOARD),
        PublishedResult("hydra", 3.24, 2.09, _LEADERBOARD),
        PublishedResult("medusa", 2.32, 1.78, _LEADERBOARD),
        PublishedResult("pld", 1.73, 1.59, _LEADERBOARD),
        PublishedResult("sps", 2.28, 1.49, _LEADERBOARD),
        PublishedResult("rest", 1.82, 1.48, _LEADERBOARD),
        PublishedResult("lookahead", 1.66, 1.27, _LEADERBOARD),
    )
}
"""Spec-Bench's A100 leaderboard for Vicuna-7B (overall speedup, #mean accepted tokens)."""


@dataclass(frozen=True)
class OverheadReport:
    """How a published speedup splits into tokens per step and cost per step.

    Args:
        implied_step_cost (`float`): tau / speedup, a step's cost in plain forwards that the result implies.
        modelled_step_cost (`float`): what a cost model says a step costs.
        unexplained (`float`): implied - modelled, in plain forwards: overhead the model does not capture.
        predicted_speedup (`float`): tau / modelled_step_cost.
        relative_error (`float`): predicted / published speedup - 1.
    """

    implied_step_cost: float
    modelled_step_cost: float
    unexplained: float
    predicted_speedup: float
    relative_error: float

    def to_dict(self) -> dict:
        return asdict(self)


def implied_step_cost(tau: float, speedup: float) -> float:
    """The cost of one step, in plain decoding forwards, that tokens-per-step `tau` and `speedup` imply."""
    if not tau >= 1.0:
        raise ValueError(f"tau counts the target's own token, so it is at least 1, got {tau!r}.")
    return tau / check_positive("speedup", speedup, "plain time / speculative time")


def explain_published(result: PublishedResult, modelled_step_cost: float) -> OverheadReport:
    """Split a published result's implied step cost into what `modelled_step_cost` explains and the rest."""
    implied = implied_step_cost(result.tau, result.speedup)
    modelled = check_positive("modelled_step_cost", modelled_step_cost, "a step's cost in plain forwards")
    predicted = result.tau / modelled
    return OverheadReport(implied, modelled, implied - modelled, predicted, predicted / result.speedup - 1.0)
