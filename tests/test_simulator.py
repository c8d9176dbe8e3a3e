"""The simulator's closed forms, trees, roofline, recommendations, calibration and CLI, against values computed
by hand (the Monte-Carlo has its own file, tests/test_simulator_monte_carlo.py)."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_specdec.simulator import (
    CPU_QWEN_1_5B_BF16,
    DEVICES,
    EPYC_2_THREADS,
    H100_SXM,
    SPEC_BENCH_A100_VICUNA_7B,
    CostCurve,
    Device,
    ModelSpec,
    RunCounts,
    acceptance_from_stats,
    alpha_from_tau,
    best_tree,
    calibrate,
    calibrate_bench,
    calibrate_run,
    chain_tree,
    check_tree,
    expected_speedup,
    expected_tokens,
    explain_published,
    fit_serial_device,
    forward_time,
    predict_chain,
    predict_on_device,
    predict_trees,
    recommend_draft_length,
    recommend_tree,
    tree_expected_speedup,
    tree_expected_tokens,
)
from hf_specdec.simulator.cli import add_simulate_parser, run_simulate
from hf_specdec.simulator.hardware import QWEN_0_5B, QWEN_1_5B

# ---------------------------------------------------------------------------------------------------------
# Closed forms for a chain
# ---------------------------------------------------------------------------------------------------------


def test_leviathan_example_by_hand() -> None:
    # (1 - 0.8**5) / ((1 - 0.8) * (4 * 0.2 + 1)) = 0.67232 / 0.36
    assert expected_speedup(0.8, 4, 0.2) == pytest.approx(0.67232 / 0.36, rel=1e-12)
    assert round(expected_speedup(0.8, 4, 0.2), 4) == 1.8676
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616, rel=1e-12)  # 0.67232 / 0.2


def test_expected_tokens_edge_cases() -> None:
    assert expected_tokens(1.0, 6) == 7.0  # every draft accepted: gamma + the bonus token
    assert expected_tokens(0.0, 6) == 1.0  # nothing accepted: the target's own token
    assert expected_tokens(0.7, 0) == 1.0  # plain decoding
    assert expected_tokens(1 - 1e-12, 3) == pytest.approx(4.0)  # continuous at alpha -> 1
    assert expected_speedup(0.5, 0, 0.3) == 1.0


def test_per_position_rates_by_hand() -> None:
    # 1 + 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.2
    assert expected_tokens([0.9, 0.5, 0.2], 3) == pytest.approx(2.44)
    assert expected_tokens([0.9, 0.5, 0.2, 0.7], 2) == pytest.approx(2.35)  # extra rates are ignored
    assert expected_tokens([0.8] * 5, 5) == pytest.approx(expected_tokens(0.8, 5))


def test_alpha_from_tau_inverts_expected_tokens() -> None:
    assert alpha_from_tau(expected_tokens(0.73, 5), 5) == pytest.approx(0.73, abs=1e-12)


def test_cost_curve_interpolates_and_extrapolates() -> None:
    curve = CPU_QWEN_1_5B_BF16
    assert curve(1) == 1.0
    assert curve(8) == pytest.approx(140 / 139)
    assert curve(12) == pytest.approx((140 + 176) / 2 / 139)  # halfway between the 8 and 16 points
    assert curve(96) == pytest.approx((348 + 32 * (348 - 235) / 32) / 139)  # the last segment extended
    assert CostCurve.flat()(1000) == 1.0
    assert CostCurve.from_points({4: 2.0, 1: 1.0})(2) == pytest.approx(4 / 3)
    assert CostCurve((1, 2), (2.0, 1.0))(10) == 0.5  # a falling last segment is extended flat, never down


def test_speedup_with_a_measured_cost_curve() -> None:
    # gamma 7 verifies 8 tokens: 140 ms instead of 139
    want = expected_tokens(0.8, 7) / (7 * 0.4 + 140 / 139)
    assert expected_speedup(0.8, 7, 0.4, CPU_QWEN_1_5B_BF16) == pytest.approx(want)


# ---------------------------------------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------------------------------------

PROBS = [[0.6, 0.2], [0.5, 0.3]]  # [depth][rank]


def test_tree_by_hand() -> None:
    # nodes: [0] 0.6, [0,0] 0.6*0.5, [1] 0.2, [0,1] 0.6*0.3
    tree = [[0], [0, 0], [1], [0, 1]]
    assert tree_expected_tokens(tree, PROBS) == pytest.approx(1 + 0.6 + 0.3 + 0.2 + 0.18)
    # depth 2: two draft forwards at c = 0.1, verification flat
    assert tree_expected_speedup(tree, PROBS, 0.1) == pytest.approx(2.28 / 1.2)


def test_a_chain_is_a_tree() -> None:
    rates = [0.9, 0.7, 0.6, 0.4]
    assert tree_expected_tokens(chain_tree(4), [[a] for a in rates]) == pytest.approx(expected_tokens(rates, 4))
    assert tree_expected_speedup(chain_tree(4), [[a] for a in rates], 0.3, CPU_QWEN_1_5B_BF16) == pytest.approx(
        expected_speedup(rates, 4, 0.3, CPU_QWEN_1_5B_BF16)
    )


def _all_trees(probs: list[list[float]], size: int) -> list[list[tuple[int, ...]]]:
    """Every tree of `size` nodes within `probs`' depths and ranks (brute force)."""
    nodes = [p for d in range(1, len(probs) + 1) for p in itertools.product(*(range(len(r)) for r in probs[:d]))]
    trees = []
    for subset in itertools.combinations(nodes, size):
        chosen = set(subset)
        if all(len(p) == 1 or p[:-1] in chosen for p in subset):
            trees.append(list(subset))
    return trees


@pytest.mark.parametrize("size", range(1, 7))
def test_best_tree_is_optimal(size: int) -> None:
    tree = best_tree(PROBS, size)
    check_tree(tree)
    best_by_brute_force = max(tree_expected_tokens(t, PROBS) for t in _all_trees(PROBS, size))
    assert tree_expected_tokens(tree, PROBS) == pytest.approx(best_by_brute_force)


def test_best_tree_order() -> None:
    assert best_tree(PROBS, 3) == ((0,), (0, 0), (1,))  # 0.6, 0.3, 0.2 beat [0,1] at 0.18


# ---------------------------------------------------------------------------------------------------------
# Invalid input
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [-0.1, 1.5, math.nan, [0.9, 1.2]])
def test_alpha_outside_unit_interval(alpha: float | list[float]) -> None:
    with pytest.raises(ValueError, match=r"probability in \[0, 1\]"):
        expected_speedup(alpha, 2, 0.1)


def test_invalid_costs_and_lengths() -> None:
    with pytest.raises(ValueError, match="cost_ratio must be a finite number >= 0"):
        expected_speedup(0.8, 4, -0.2)
    with pytest.raises(ValueError, match="gamma must be an integer >= 0"):
        expected_tokens(0.8, -1)
    with pytest.raises(ValueError, match="pass at least 4 rates"):
        expected_tokens([0.9, 0.8], 4)
    with pytest.raises(ValueError, match="finite and > 0"):
        CostCurve((1, 8), (139.0, -1.0))
    with pytest.raises(ValueError, match="must start at 1 token"):
        CostCurve((2, 8), (1.0, 1.0))
    with pytest.raises(ValueError, match="strictly increasing"):
        CostCurve((1, 8, 4), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="memory_bandwidth must be a finite number > 0"):
        Device("bad", -1.0, 1e12)
    with pytest.raises(ValueError, match="overhead must be a finite number >= 0"):
        Device("bad", 1e12, 1e12, overhead=-0.001)
    with pytest.raises(ValueError, match="params must be a finite number > 0"):
        ModelSpec(-7e9)


def test_invalid_trees() -> None:
    with pytest.raises(ValueError, match=r"has no parent: add \[0\]"):
        check_tree([[0, 0]])
    with pytest.raises(ValueError, match="each path once"):
        check_tree([[0], [0]])
    with pytest.raises(ValueError, match="sum to at most 1"):
        tree_expected_tokens([[0]], [[0.7, 0.5]])
    with pytest.raises(ValueError, match="beyond accept_probs"):
        tree_expected_tokens([[0], [0, 0]], [[0.7]])


# ---------------------------------------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------------------------------------


def test_70b_on_h100_is_42_ms_per_token() -> None:
    seconds = forward_time(ModelSpec(70e9, bytes_per_param=2.0), H100_SXM)
    assert seconds == pytest.approx(140e9 / 3.35e12)
    assert 41e-3 < seconds < 43e-3
    # verification is free until the math of n tokens outweighs the weight traffic: n = 2 * 989 / (2 * 3.35)
    target = ModelSpec(70e9)
    assert forward_time(target, H100_SXM, 256) == seconds
    assert forward_time(target, H100_SXM, 512) > 1.7 * seconds


def test_cpu_preset_is_the_fit_to_the_measurements() -> None:
    fitted = fit_serial_device("cpu", QWEN_1_5B, CPU_QWEN_1_5B_BF16, 1e-3, draft=(QWEN_0_5B, 0.055))
    assert fitted.memory_bandwidth == pytest.approx(EPYC_2_THREADS.memory_bandwidth, rel=1e-3)
    assert fitted.peak_flops == pytest.approx(EPYC_2_THREADS.peak_flops, rel=1e-3)
    assert fitted.overhead == pytest.approx(EPYC_2_THREADS.overhead, rel=1e-3)
    for n, ms in zip(CPU_QWEN_1_5B_BF16.tokens, CPU_QWEN_1_5B_BF16.times, strict=True):
        assert forward_time(QWEN_1_5B, EPYC_2_THREADS, n) * 1e3 == pytest.approx(ms, rel=0.15)
    assert forward_time(QWEN_0_5B, EPYC_2_THREADS) * 1e3 == pytest.approx(55.0, rel=1e-3)


def test_predict_on_device() -> None:
    prediction = predict_on_device(
        ModelSpec(70e9), ModelSpec(8e9), DEVICES["h100"], 0.8, range(0, 9), accept_probs=PROBS, tree_sizes=[3]
    )
    assert prediction.costs.cost_ratio == pytest.approx(8 / 70)
    assert [p.expected_speedup for p in prediction.chain] == pytest.approx(
        [expected_speedup(0.8, g, 8 / 70) for g in range(9)]  # memory-bound: the flat curve of the paper
    )
    assert prediction.trees[0].tree == ((0,), (0, 0), (1,))
    assert prediction.milliseconds_per_token(prediction.chain[0]) == pytest.approx(1e3 * 140e9 / 3.35e12)


# ---------------------------------------------------------------------------------------------------------
# Recommendation
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("alpha", "cost_ratio"), [(0.8, 0.2), (0.9, 0.05), (0.6, 0.4)])
def test_recommend_picks_the_argmax(alpha: float, cost_ratio: float) -> None:
    chosen = recommend_draft_length(alpha, cost_ratio, CPU_QWEN_1_5B_BF16, max_gamma=12)
    table = predict_chain(alpha, range(13), cost_ratio, CPU_QWEN_1_5B_BF16)
    assert chosen.expected_speedup == max(p.expected_speedup for p in table)
    assert chosen.draft_length == max(table, key=lambda p: p.expected_speedup).draft_length


def test_recommend_known_optimum_and_no_speculation() -> None:
    assert recommend_draft_length(0.8, 0.2).draft_length == 4  # 1.8676x, see the Leviathan example
    assert recommend_draft_length(0.2, 1.0).draft_length == 0  # drafting costs more than it brings


def test_recommend_tree_picks_the_argmax() -> None:
    probs = [[0.7, 0.15, 0.05], [0.6, 0.2], [0.5, 0.1], [0.4]]
    chosen = recommend_tree(probs, 0.05, CPU_QWEN_1_5B_BF16, max_nodes=30)
    table = predict_trees(probs, range(1, 31), 0.05, CPU_QWEN_1_5B_BF16)
    assert chosen.expected_speedup == max(p.expected_speedup for p in table)


# ---------------------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------------------


def test_acceptance_from_stats() -> None:
    # four steps of 3 drafts accepting 3, 1, 0 and 2: SpeculativeStats counts, per position j, the steps that
    # drafted a j-th token and those that accepted drafts 1..j
    stats = SimpleNamespace(drafted_at_position=torch.tensor([4, 4, 4]), accepted_at_position=torch.tensor([3, 2, 1]))
    rates = acceptance_from_stats(stats)  # prefix acceptance 3/4, 2/4, 1/4 -> conditional 3/4, 2/3, 1/2
    assert rates == pytest.approx((0.75, 2 / 3, 0.5))
    assert expected_tokens(rates, 3) == pytest.approx((6 + 4) / 4)  # 6 accepted + 4 own tokens in 4 forwards
    stats.drafted_at_position = torch.tensor([5, 5, 4])  # a fifth step drafted only 2
    with pytest.raises(ValueError, match="schedule='constant'"):
        acceptance_from_stats(stats)


def test_calibrate_reports_the_relative_error() -> None:
    report = calibrate([0.75, 2 / 3, 0.5], 3, 0.4, CPU_QWEN_1_5B_BF16, measured_speedup=1.1, measured_tau=2.5)
    predicted = 2.5 / (3 * 0.4 + 121 / 139)  # three draft forwards, then 4 tokens verified in 121 ms
    assert report.predicted_speedup == pytest.approx(predicted)
    assert report.relative_error == pytest.approx(predicted / 1.1 - 1)


def test_calibrate_run_with_varying_draft_lengths() -> None:
    # four steps drafting 3, 3, 2 and 1 tokens: D = (4, 3, 2); they accepted 6 drafts in all, A = (3, 2, 1)
    counts = RunCounts(steps=4, drafted_at_position=(4, 3, 2), accepted_at_position=(3, 2, 1))
    assert counts.expected_tokens() == 2.5
    assert counts.step_cost(0.4, None) == pytest.approx(9 / 4 * 0.4 + 1)
    verify = (2 * 121 + 120 + 119) / 4 / 139  # V(4) twice, V(3) (interpolated), V(2)
    assert counts.step_cost(0.4, CPU_QWEN_1_5B_BF16) == pytest.approx(9 / 4 * 0.4 + verify)
    report = calibrate_run(counts, 0.4, CPU_QWEN_1_5B_BF16, measured_speedup=1.2)
    assert report.relative_error == pytest.approx(2.5 / (0.9 + verify) / 1.2 - 1)


def test_calibrate_run_of_a_constant_length_is_the_closed_form() -> None:
    counts = RunCounts(steps=4, drafted_at_position=(4, 4, 4), accepted_at_position=(3, 2, 1))
    by_counts = calibrate_run(counts, 0.3, CPU_QWEN_1_5B_BF16, 1.0)
    by_rates = calibrate([0.75, 2 / 3, 0.5], 3, 0.3, CPU_QWEN_1_5B_BF16, 1.0)
    assert by_counts.predicted_speedup == pytest.approx(by_rates.predicted_speedup)


def test_calibrate_bench_reads_results_json() -> None:
    sample = {"target_forwards": [2], "drafted_at_position": [2, 1], "accepted_at_position": [1, 0]}
    results = {
        "summary": {"plain": {"seconds": 0.6, "tokens": 3}, "specdec": {"speedup_vs_plain": 1.1, "tau": 1.5}},
        "cost_curve_seconds": {"1": 0.1, "2": 0.1, "4": 0.12},
        "samples": [{"method": "plain"}, {"method": "specdec", "draft_seconds": 0.12, **sample}],
    }
    # steps drafted 2 and 1 tokens: V(3) = 1.1, V(2) = 1; the draft took 0.12 s / 3 drafted tokens = 0.04 s
    verify = (1.1 + 1.0) / 2
    report = calibrate_bench(results)  # unit: plain decoding's 0.2 s per token, so c = 0.2
    assert report.predicted_tau == 1.5
    assert report.predicted_speedup == pytest.approx(1.5 / (3 / 2 * 0.2 + verify))
    assert report.measured_speedup == 1.1
    report = calibrate_bench(results, unit="curve")  # unit: the curve's 0.1 s forward, so c = 0.4
    assert report.predicted_speedup == pytest.approx(1.5 / (3 / 2 * 0.4 + verify))


def test_spec_bench_medusa_implied_overhead() -> None:
    medusa = SPEC_BENCH_A100_VICUNA_7B["medusa"]
    report = explain_published(medusa, modelled_step_cost=1.0)
    assert report.implied_step_cost == pytest.approx(2.32 / 1.78)  # 1.303 plain forwards per step
    assert report.unexplained == pytest.approx(2.32 / 1.78 - 1.0)
    assert report.predicted_speedup == pytest.approx(2.32)


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="hf-specdec")
    add_simulate_parser(parser.add_subparsers(dest="command"))
    status = run_simulate(parser.parse_args(["simulate", *argv]))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_json_has_expected_speedup(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(["--alpha", "0.8", "--gamma", "4", "--cost-ratio", "0.2", "--json"], capsys)
    report = json.loads(out)
    assert status == 0
    assert report["expected_speedup"] == pytest.approx(1.8676, abs=5e-5)
    assert report["predictions"][0]["expected_tokens"] == pytest.approx(3.3616)


def test_cli_device_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--alpha", "0.8", "--gamma", "1..8", "--device", "h100", "--target-params", "70e9"]
    status, out, _ = _run([*argv, "--draft-params", "8e9", "--json"], capsys)
    report = json.loads(out)
    assert status == 0
    assert report["target_ms_per_token"] == pytest.approx(41.79, abs=0.01)
    assert [row["draft_length"] for row in report["predictions"]] == list(range(1, 9))
    assert report["recommended"]["draft_length"] == 5
    status, out, _ = _run([*argv, "--cost-ratio", "0.05"], capsys)  # the table; without a draft, c is given
    assert status == 0 and "recommended: draft length" in out


def test_cli_errors_are_loud(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _run(["--alpha", "80"], capsys)
    assert status == 2 and "probability in [0, 1]" in err
    status, _, err = _run(["--device", "h100"], capsys)
    assert status == 2 and "--target-params" in err


def test_cli_without_a_draft_cost_is_refused_and_says_what_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _run(["--alpha", "0.8"], capsys)  # not priced at nothing (4.33x at gamma 8)
    assert status == 2 and not out
    assert "the draft's cost is not given: pass --cost-ratio C" in err
    assert "or --device, --target-params and --draft-params" in err
    status, out, err = _run(["--alpha", "0.8", "--device", "h100", "--target-params", "70e9"], capsys)
    assert status == 2 and not out and "pass --cost-ratio C" in err and "or --draft-params N" in err
    status, out, _ = _run(["--alpha", "0.8", "--cost-ratio", "0", "--json"], capsys)  # free only when asked
    assert status == 0 and json.loads(out)["expected_speedup"] == pytest.approx(4.3289, abs=5e-5)


def test_cli_checks_the_acceptance_before_asking_for_the_draft_cost(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["--alpha", "80"], "probability in [0, 1]"),
        (["--alpha", "0.9,0.8", "--gamma", "3"], "2 per-position acceptance rates cannot describe a draft of 3"),
        (["--tree-probs", "[[1.5]]"], "accept_probs[0][0] must be a probability in [0, 1]"),
        (["--tree-probs", "[[0.5]]", "--tree-sizes", "2"], "no tree of 2 nodes"),
    ):
        status, _, err = _run(argv, capsys)
        assert status == 2 and message in err and "--cost-ratio" not in err, argv


def test_cli_refuses_two_costs_for_the_draft(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "h100", "--target-params", "70e9", "--draft-params", "8e9", "--cost-ratio", "0.1"]
    status, out, err = _run(argv, capsys)
    assert status == 2 and not out and "pass one of them" in err


def test_cli_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "speedup.png"
    status, _, _ = _run(["--gamma", "1..6", "--cost-ratio", "0.2", "--plot", str(png)], capsys)
    assert status == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------------------------------------


def test_simulator_page_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Every `python` block of docs/simulator.md runs, in order, in one namespace."""
    page = Path(__file__).resolve().parent.parent / "docs" / "simulator.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 5
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)


def test_the_table_says_when_its_alpha_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(["--tree-probs", "[[0.6,0.15],[0.4]]", "--tree-sizes", "1..3", "--cost-ratio", "0.05"], capsys)
    assert out.startswith("alpha 0.8 for the chains (the default: --alpha sets it); ")
    _, out, _ = _run(["--alpha", "0.7", "--cost-ratio", "0.05"], capsys)
    assert out.startswith("alpha 0.7; draft cost ratio")
