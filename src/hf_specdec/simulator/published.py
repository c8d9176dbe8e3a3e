"""Published results read backwards: what a step must have cost, given the reported tau and speedup.

A method that emits tau tokens per step at `speedup` times plain decoding's rate spends `tau / speedup`
plain forwards per step. Whatever part of that a cost model (drafting, verification on the roofline) does
not explain is the implementation's own overhead; [`explain_published`] splits the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hf_specdec.simulator.validation import check_positive


@dataclass(frozen=True)
class PublishedResult:
    """A published tau (mean accepted tokens per step, counting the target's own token) and speedup."""

    method: str
    tau: float
    speedup: float
    source: str = ""


_LEADERBOARD = (
    "Spec-Bench leaderboard (Xia et al. 2024, commit 5544fd7), A100 80GB, Vicuna-7B-v1.3, greedy, fp16, batch 1"
)
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
