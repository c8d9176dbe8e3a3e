"""Predict the speedup of speculative decoding before running it.

- closed forms for chains (Leviathan et al.) with per-position acceptance and a measured verification cost
  curve, and for trees (Medusa's choices format): [`expected_tokens`], [`expected_speedup`],
  [`tree_expected_tokens`], [`tree_expected_speedup`];
- a Monte-Carlo through the library's own acceptance rules: [`simulate_chain`];
- a roofline cost model with device presets: [`Device`], [`ModelSpec`], [`DEVICES`], [`predict_on_device`];
- recommendations: [`recommend_draft_length`], [`recommend_tree`];
- calibration against measured runs and published results: [`calibrate`], [`calibrate_run`],
  [`calibrate_bench`], [`explain_published`].

See docs/simulator.md.
"""

from hf_specdec.simulator.calibration import (
    CalibrationReport,
    RunCounts,
    acceptance_from_stats,
    calibrate,
    calibrate_bench,
    calibrate_run,
)
from hf_specdec.simulator.closed_form import (
    acceptance_by_position,
    alpha_from_tau,
    expected_speedup,
    expected_tokens,
    step_cost,
)
from hf_specdec.simulator.cost_curve import CPU_QWEN_1_5B_BF16, CostCurve
from hf_specdec.simulator.estimates import ChiSquare, Estimate
from hf_specdec.simulator.hardware import (
    A100_80GB,
    DEVICES,
    EPYC_2_THREADS,
    H100_SXM,
    H200,
    Device,
    DeviceCosts,
    ModelSpec,
    device_costs,
    fit_serial_device,
    forward_time,
)
from hf_specdec.simulator.monte_carlo import (
    MonteCarloResult,
    draft_and_verify,
    pair_with_acceptance,
    simulate_chain,
    synthetic_pairs,
)
from hf_specdec.simulator.plot import plot_speedup
from hf_specdec.simulator.predict import DevicePrediction, Prediction, predict_chain, predict_on_device, predict_trees
from hf_specdec.simulator.published import (
    SPEC_BENCH_A100_VICUNA_7B,
    OverheadReport,
    PublishedResult,
    explain_published,
    implied_step_cost,
)
from hf_specdec.simulator.recommend import recommend_draft_length, recommend_tree
from hf_specdec.simulator.tree import (
    best_tree,
    chain_tree,
    check_tree,
    node_probabilities,
    tree_depth,
    tree_expected_speedup,
    tree_expected_tokens,
)

__all__ = [
    "A100_80GB",
    "CPU_QWEN_1_5B_BF16",
    "DEVICES",
    "EPYC_2_THREADS",
    "H100_SXM",
    "H200",
    "SPEC_BENCH_A100_VICUNA_7B",
    "CalibrationReport",
    "ChiSquare",
    "CostCurve",
    "Device",
    "DeviceCosts",
    "DevicePrediction",
    "Estimate",
    "ModelSpec",
    "MonteCarloResult",
    "OverheadReport",
    "Prediction",
    "PublishedResult",
    "RunCounts",
    "acceptance_by_position",
    "acceptance_from_stats",
    "alpha_from_tau",
    "best_tree",
    "calibrate",
    "calibrate_bench",
    "calibrate_run",
    "chain_tree",
    "check_tree",
    "device_costs",
    "draft_and_verify",
    "expected_speedup",
    "expected_tokens",
    "explain_published",
    "fit_serial_device",
    "forward_time",
    "implied_step_cost",
    "node_probabilities",
    "pair_with_acceptance",
    "plot_speedup",
    "predict_chain",
    "predict_on_device",
    "predict_trees",
    "recommend_draft_length",
    "recommend_tree",
    "simulate_chain",
    "step_cost",
    "synthetic_pairs",
    "tree_depth",
    "tree_expected_speedup",
    "tree_expected_tokens",
]
