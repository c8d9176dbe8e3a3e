"""Speedup against draft length for several acceptance rates, as a PNG (matplotlib, an optional dependency)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hf_specdec.extras import require
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.predict import predict_chain


def plot_speedup(
    path: str | Path,
    alphas: Sequence[float],
    gammas: Sequence[int],
    cost_ratio: float,
    verify_cost: CostCurve | None = None,
    title: str = "",
) -> Path:
    """Draw expected speedup against draft length, one line per acceptance rate, and save it to `path`.

    Raises:
        `hf_specdec.extras.MissingExtraError` (a `ModuleNotFoundError`): matplotlib is not installed (it is
            optional: the `[plot]` extra).
    """
    require("plot", "matplotlib", purpose="Plotting")
    from matplotlib.figure import Figure  # imported here: only plotting needs it

    figure = Figure(figsize=(6.4, 4.2), layout="constrained")  # no pyplot: no global state, no GUI backend
    axes = figure.add_subplot()
    for alpha in alphas:
        speedups = [p.expected_speedup for p in predict_chain(alpha, gammas, cost_ratio, verify_cost)]
        (line,) = axes.plot(list(gammas), speedups, marker="o", label=f"alpha = {alpha:g}")
        top = max(range(len(speedups)), key=speedups.__getitem__)  # the recommended draft length
        axes.plot([gammas[top]], [speedups[top]], marker="*", markersize=16, color=line.get_color())
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")  # break-even with plain decoding
    axes.set_xlabel("draft length gamma (tokens drafted per step)")
    axes.set_ylabel("expected speedup over plain decoding")
    axes.set_title(title or f"draft cost ratio c = {cost_ratio:.3g}")
    axes.legend()
    axes.grid(alpha=0.3)
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path
