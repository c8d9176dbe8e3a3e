"""`hf-specdec simulate`: predicted speedup for each draft length (and tree size), as a table or JSON.

Examples:

    hf-specdec simulate --alpha 0.8 --gamma 1..8 --cost-ratio 0.2
    hf-specdec simulate --alpha 0.8 --device h100 --target-params 70e9 --draft-params 8e9 --json
    hf-specdec simulate --alpha 0.9,0.8,0.7,0.6 --gamma 1..4 --cost-ratio 0.4 --cost-curve cpu-qwen-1.5b
    hf-specdec simulate --tree-probs '[[0.6,0.15],[0.5,0.15],[0.4]]' --tree-sizes 1..10 --cost-ratio 0.05
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from hf_specdec.cli_args import (
    HelpFormatter,
    non_negative_float,
    one_line,
    output_file,
    positive_float,
    positive_int,
    random_seed,
)
from hf_specdec.extras import require
from hf_specdec.simulator.closed_form import AcceptanceRates
from hf_specdec.simulator.cost_curve import CPU_QWEN_1_5B_BF16, CostCurve
from hf_specdec.simulator.hardware import DEVICES, ModelSpec, device_costs
from hf_specdec.simulator.monte_carlo import pair_with_acceptance, simulate_chain
from hf_specdec.simulator.plot import plot_speedup
from hf_specdec.simulator.predict import Prediction, predict_chain, predict_trees
from hf_specdec.simulator.recommend import best
from hf_specdec.simulator.tree import tree_capacity

COST_CURVES = {"cpu-qwen-1.5b": CPU_QWEN_1_5B_BF16}


MAX_TOKENS = 1024
"""The largest draft length or tree size simulated."""

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _int_range(text: str, low: int = 0) -> list[int]:
    """`"4"`, `"1,2,4"` or `"1..8"` (inclusive) as a list of ints, each in `low..MAX_TOKENS`."""
    try:
        ends = [int(part) for part in text.split("..")] if ".." in text else None
        values = None if ends else [int(part) for part in text.split(",")]
        first, last = ends or (min(values), max(values))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 4, 1,2,4 or 1..8, got {text!r}") from None
    if first > last:
        raise argparse.ArgumentTypeError(f"{text!r} is an empty range: write the smaller end first, as in 1..8")
    if first < low or last > MAX_TOKENS:  # checked before a range is built: 1..10**9 would take seconds
        raise argparse.ArgumentTypeError(f"expected whole numbers in {low}..{MAX_TOKENS}, got {text!r}")
    return values or list(range(first, last + 1))


def _tree_sizes_arg(text: str) -> list[int]:
    return _int_range(text, low=1)


def _floats(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not all(math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values


def _tree_probs(text: str) -> list[list[float]]:
    """JSON `[depth][rank]` acceptance probabilities: a list of non-empty lists of numbers (ranges are checked by
    the simulator, whose message says what they mean)."""
    try:
        probs = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected JSON such as [[0.6,0.15],[0.5]], got {text!r}") from None
    rows_ok = isinstance(probs, list) and probs and all(isinstance(row, list) and row for row in probs)
    numbers = rows_ok and all(
        isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p) for row in probs for p in row
    )
    if not numbers:
        raise argparse.ArgumentTypeError(
            f"expected a list of depths, each a non-empty list of probabilities by rank, such as [[0.6,0.15],[0.5]]; "
            f"got {text!r}"
        )
    return probs


def _plot_file(text: str) -> Path:
    path = output_file(text)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(f"name the plot with one of {', '.join(PLOT_SUFFIXES)}, got {text!r}")
    return path


def _cost_curve(text: str) -> CostCurve:
    """A preset name or `"1:139,2:119,..."` (tokens:time)."""
    if text in COST_CURVES:
        return COST_CURVES[text]
    expected = f"expected a preset ({', '.join(COST_CURVES)}) or tokens:time pairs like 1:139,8:140,64:348"
    try:
        points = [(int(n), float(t)) for n, t in (part.split(":") for part in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
    try:
        return CostCurve.from_points(points, source="--cost-curve")
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{expected}; {error}") from None


def add_simulate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `simulate` subcommand to an `hf-specdec` parser's subparsers."""
    sim = subparsers.add_parser(
        "simulate",
        help="predict the speedup of each draft length / tree size (closed forms, roofline, Monte-Carlo)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    sim.add_argument(
        "--alpha", type=_floats, default=None, help="acceptance rate, or rates by position: 0.9,0.8 (default: 0.8)"
    )
    sim.add_argument(
        "--gamma", type=_int_range, default="0..8", help=f"draft lengths: 4, 1,2,4 or 1..8 (<= {MAX_TOKENS})"
    )
    sim.add_argument(
        "--cost-ratio",
        type=non_negative_float,
        help="a draft forward's cost in target forwards (c), e.g. 0.2; required, unless --device and --draft-params "
        "price the draft (0 only for a draft that truly costs nothing)",
    )
    sim.add_argument(
        "--cost-curve",
        type=_cost_curve,
        help=f"verification cost: a preset ({', '.join(COST_CURVES)}) or tokens:time pairs",
    )
    hw = sim.add_argument_group("hardware (roofline) instead of --cost-ratio/--cost-curve")
    hw.add_argument("--device", choices=sorted(DEVICES), help="device preset")
    hw.add_argument("--target-params", type=positive_float, help="target parameters, e.g. 70e9")
    hw.add_argument(
        "--draft-params", type=positive_float, help="draft parameters, e.g. 8e9: the draft's cost (else --cost-ratio)"
    )
    hw.add_argument("--bytes-per-param", type=positive_float, default=2.0, help="2 for bf16, 1 for int8")
    hw.add_argument("--overhead-ms", type=non_negative_float, help="per-forward overhead, replacing the preset's")
    hw.add_argument("--batch-size", type=positive_int, default=1, help="rows per forward")
    tree = sim.add_argument_group("trees")
    tree.add_argument("--tree-probs", type=_tree_probs, help="JSON [depth][rank] acceptance probabilities")
    tree.add_argument(
        "--tree-sizes", type=_tree_sizes_arg, help="tree sizes in nodes (default: 1..64, at most the full tree)"
    )
    out = sim.add_argument_group("output")
    out.add_argument(
        "--monte-carlo", type=positive_int, metavar="STEPS", help="also simulate STEPS steps per draft length"
    )
    out.add_argument("--seed", type=random_seed, default=0, help="seed of the Monte-Carlo")
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    out.add_argument(
        "--plot", type=_plot_file, metavar="PNG", help="save speedup against draft length for several alphas"
    )
    out.add_argument("--plot-alphas", type=_floats, default="0.5,0.6,0.7,0.8,0.9", help="alphas to plot")
    return sim


def check_simulate_args(args: argparse.Namespace) -> None:
    """Refuse, before simulating, a plot without matplotlib."""
    if args.plot is not None:
        require("plot", "matplotlib", purpose="--plot")


@dataclass(frozen=True)
class _Costs:
    cost_ratio: float
    verify_cost: CostCurve | None
    target_ms: float | None
    description: str


def _costs(args: argparse.Namespace) -> _Costs:
    if args.device is None:
        roofline_only = (args.target_params, args.draft_params, args.overhead_ms, None if args.batch_size == 1 else 1)
        if any(option is not None for option in roofline_only):
            raise ValueError(
                "--target-params, --draft-params, --overhead-ms and --batch-size describe a roofline: add --device "
                "(cpu, a100, h100 or h200)."
            )
        _require_cost_ratio(args)
        curve = args.cost_curve
        where = "measured verification cost curve" if curve else "flat verification cost (Leviathan et al.)"
        return _Costs(args.cost_ratio, curve, None, where)
    if args.cost_curve is not None:
        raise ValueError("Give either --device (a roofline) or --cost-curve (a measurement), not both.")
    if args.target_params is None:
        raise ValueError("--device needs --target-params, e.g. --target-params 70e9.")
    if args.draft_params is None:
        _require_cost_ratio(args)
    elif args.cost_ratio is not None:
        raise ValueError(
            "--draft-params prices the draft on the device's roofline, and --cost-ratio gives its cost directly: "
            "pass one of them."
        )
    device = DEVICES[args.device]
    if args.overhead_ms is not None:
        device = replace(device, overhead=args.overhead_ms / 1e3)
    target = ModelSpec(args.target_params, args.bytes_per_param)
    draft = None if args.draft_params is None else ModelSpec(args.draft_params, args.bytes_per_param)
    most = max([*args.gamma, *_tree_sizes(args), 1]) + 1
    costs = device_costs(target, draft, device, max_tokens=most, batch_size=args.batch_size)
    ratio = costs.cost_ratio if draft is not None else args.cost_ratio
    where = f"roofline of {device.name}: target {1e3 * costs.target_seconds:.2f} ms per forward"
    return _Costs(ratio, costs.verify_cost, 1e3 * costs.target_seconds, where)


def _require_cost_ratio(args: argparse.Namespace) -> None:
    """Refuse to price the draft at nothing by default: every speedup would be an upper bound."""
    if args.cost_ratio is None:
        roofline = "--draft-params N" if args.device is not None else "--device, --target-params and --draft-params"
        raise ValueError(
            "the draft's cost is not given: pass --cost-ratio C (a draft forward's time in target forwards, e.g. 0.2 "
            f"for a draft 5x faster than the target; 0 for a draft that costs nothing), or {roofline} for the "
            "roofline to price the draft."
        )


DEFAULT_ALPHA = 0.8  # the chains' acceptance rate when --alpha is not given


def _check_acceptance(args: argparse.Namespace) -> None:
    """Refuse acceptance figures the predictions cannot use (out of [0, 1], too few rates by position, trees larger
    than --tree-probs allows), before the costs: these errors hold whatever the costs."""
    predict_chain(_alpha(args), args.gamma, cost_ratio=0.0)
    if args.tree_probs is not None:
        predict_trees(args.tree_probs, _tree_sizes(args), cost_ratio=0.0)


def _tree_sizes(args: argparse.Namespace) -> list[int]:
    if args.tree_probs is None:
        return []
    if args.tree_sizes is not None:
        return args.tree_sizes
    return list(range(1, min(64, tree_capacity(args.tree_probs)) + 1))


def _alpha(args: argparse.Namespace) -> AcceptanceRates:
    return args.alpha[0] if len(args.alpha) == 1 else args.alpha


def _rows(args: argparse.Namespace, costs: _Costs) -> list[dict]:
    predictions = predict_chain(_alpha(args), args.gamma, costs.cost_ratio, costs.verify_cost)
    if args.tree_probs is not None:
        predictions += predict_trees(args.tree_probs, _tree_sizes(args), costs.cost_ratio, costs.verify_cost)
    top = best(predictions)
    rows = []
    for prediction in predictions:
        row = prediction.to_dict() | {"recommended": prediction is top}
        if costs.target_ms is not None:
            row["ms_per_token"] = costs.target_ms / prediction.expected_speedup
        rows.append(row)
    if args.monte_carlo:
        _add_monte_carlo(args, costs, predictions, rows)
    return rows


def _add_monte_carlo(args: argparse.Namespace, costs: _Costs, predictions: list[Prediction], rows: list[dict]) -> None:
    if len(args.alpha) != 1:
        raise ValueError("--monte-carlo simulates one constant --alpha (a fixed target/draft pair with that overlap).")
    pair = pair_with_acceptance(args.alpha[0], seed=args.seed)
    for prediction, row in zip(predictions, rows, strict=True):
        if prediction.kind == "chain" and prediction.draft_length > 0:
            result = simulate_chain(
                prediction.draft_length,
                num_steps=args.monte_carlo,
                pair=pair,
                cost_ratio=costs.cost_ratio,
                verify_cost=costs.verify_cost,
                seed=args.seed,
            )
            row["monte_carlo"] = result.to_dict()


def _print_table(args: argparse.Namespace, costs: _Costs, rows: list[dict]) -> None:
    chains = any(row["kind"] == "chain" and row["draft_length"] > 0 for row in rows)
    alphas = f"alpha {','.join(f'{a:g}' for a in args.alpha)}" if chains else ""
    if alphas and not getattr(args, "alpha_given", True):
        alphas += " for the chains (the default: --alpha sets it)"
    alphas += "; " if alphas else ""
    print(f"{alphas}draft cost ratio c = {costs.cost_ratio:.4g}; {costs.description}")
    header = f"  {'kind':<6}{'depth':>6}{'nodes':>6}{'tau':>8}{'cost':>8}{'speedup':>9}"
    header += f"{'ms/tok':>9}" if costs.target_ms is not None else ""
    header += f"{'MC tau [95% CI]':>26}" if args.monte_carlo else ""
    print(header)
    for row in rows:
        line = f"{'*' if row['recommended'] else ' '} {row['kind']:<6}{row['draft_length']:>6}{row['num_nodes']:>6}"
        line += f"{row['expected_tokens']:>8.3f}{row['step_cost']:>8.3f}{row['expected_speedup']:>8.3f}x"
        line += f"{row['ms_per_token']:>9.2f}" if "ms_per_token" in row else ""
        if "monte_carlo" in row:
            tau = row["monte_carlo"]["tau"]
            line += f"{tau['mean']:>10.3f} [{tau['low']:.3f}, {tau['high']:.3f}]"
        print(line)
    top = next(row for row in rows if row["recommended"])
    what = f"tree of {top['num_nodes']} nodes" if top["kind"] == "tree" else f"draft length {top['draft_length']}"
    print(f"* recommended: {what}, expected speedup {top['expected_speedup']:.3f}x")


def run_simulate(args: argparse.Namespace) -> int:
    """Run `hf-specdec simulate` on parsed arguments; returns the exit status."""
    args.alpha_given = args.alpha is not None
    if args.alpha is None:
        args.alpha = [DEFAULT_ALPHA]
    try:
        _check_acceptance(args)
        costs = _costs(args)
        rows = _rows(args, costs)
        if args.plot:
            Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
            plot_speedup(args.plot, args.plot_alphas, args.gamma, costs.cost_ratio, costs.verify_cost)
    except (ValueError, ModuleNotFoundError) as error:
        print(f"hf-specdec simulate: error: {one_line(error)}", file=sys.stderr)
        return 2
    if args.json:
        top = next(row for row in rows if row["recommended"])
        report = {
            "alpha": _alpha(args),
            "cost_ratio": costs.cost_ratio,
            "costs": costs.description,
            "target_ms_per_token": costs.target_ms,
            "expected_speedup": top["expected_speedup"],
            "recommended": top,
            "predictions": rows,
        }
        print(json.dumps(report, indent=2))
    else:
        _print_table(args, costs, rows)
        if args.plot:
            print(f"plot saved to {args.plot}")
    return 0
