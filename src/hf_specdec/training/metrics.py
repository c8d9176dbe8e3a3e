"""Held-out metrics of draft heads, as a `compute_metrics` for `Trainer`: each head's top-r accuracy and the
expected tokens per step of the best tree for those accuracies.

`MedusaTrainer.prediction_step` hands over, per example, how often each head's label was its rank-r candidate;
Trainer gathers them across processes, and [`HeadMetrics`] sums them over the data set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import EvalPrediction

from hf_specdec.trees.static import build_tree, expected_accepted_length

TOP_K = 10  # ranks measured per head at evaluation: what trees of up to ~100 nodes are planned from


@dataclass
class HeadMetrics:
    """`compute_metrics` for `MedusaTrainer`: `head{k}_top{r}` (the share of measured positions where head k's
    label is among its first r candidates, r = 1..`TOP_K`) and `expected_tau` (1 + the expected accepted length
    of the best `tree_nodes`-node tree for those accuracies). Trainer prefixes them (`eval_head0_top1`, ...).

    Args:
        num_heads (`int`): the heads' depth.
        tree_nodes (`int`): node budget of the tree the expected tau is computed for.
    """

    num_heads: int
    tree_nodes: int = 16

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        counts = np.asarray(prediction.predictions, dtype=np.int64).reshape(-1, self.num_heads, TOP_K + 1)
        totals = counts.sum(axis=0)  # (heads, TOP_K + 1)
        measured = np.maximum(totals.sum(axis=1, keepdims=True), 1)
        top = np.cumsum(totals[:, :TOP_K], axis=1) / measured  # (heads, TOP_K): top-r accuracy
        metrics = {f"head{k}_top{r + 1}": float(top[k, r]) for k in range(self.num_heads) for r in range(TOP_K)}
        per_rank = rank_accuracies(metrics, self.num_heads, prefix="")
        metrics["expected_tau"] = 1.0 + expected_accepted_length(build_tree(per_rank, self.tree_nodes), per_rank)
        return metrics


def rank_accuracies(metrics: dict[str, float], num_heads: int, prefix: str = "eval") -> list[list[float]]:
    """Per head, the share of positions where its rank-r candidate is right (r = 0..`TOP_K` - 1), from the top-r
    accuracies of [`HeadMetrics`] (`prefix`: Trainer's metric prefix): what `build_tree` plans trees from."""
    start = f"{prefix}_" if prefix else ""
    accuracies = []
    for k in range(num_heads):
        top = [metrics[f"{start}head{k}_top{r + 1}"] for r in range(TOP_K)]
        accuracies.append([max(b - a, 0.0) for a, b in zip([0.0, *top[:-1]], top, strict=True)])
    return accuracies
