"""Predicted speedup for each draft length and tree size: from acceptance figures and costs, or on a device.

Every prediction reduces to the same three numbers: expected tokens per step (tau), the step's cost in
target forwards over one token, and their ratio, the expected speedup over plain decoding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hf_specdec.simulator.closed_form import AcceptanceRates, expected_tokens, step_cost
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.hardware import Device, DeviceCosts, ModelSpec, device_costs
from hf_specdec.simulator.tree import Tree, best_tree, tree_depth, tree_expected_tokens


@dataclass(frozen=True)
class Prediction:
    """The predicted figures of one configuration.

    Args:
        kind (`str`): `"chain"` or `"tree"`.
        draft_length (`int`): gamma for a chain (0 is plain decoding), the depth for a tree.
        num_nodes (`int`): drafted tokens verified per step (gamma for a chain).
        expected_tokens (`float`): tau, tokens per target forward.
        step_cost (`float`): a step's cost in target forwards over one token.
        expected_speedup (`float`): tau / step_cost.
        tree (`Tree`, *optional*): the tree's paths (Medusa choices), for a tree.
    """

    kind: str
    draft_length: int
    num_nodes: int
    expected_tokens: float
    step_cost: float
    expected_speedup: float
    tree: Tree | None = None

    def to_dict(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k != "tree"}
        if self.tree is not None:
            out["tree"] = [list(path) for path in self.tree]
        return out


def predict_chain(
    alpha: AcceptanceRates, gammas: Iterable[int], cost_ratio: float, verify_cost: CostCurve | None = None
) -> list[Prediction]:
    """One [`Prediction`] per draft length in `gammas` (a per-position `alpha` needs max(gammas) entries)."""
    predictions = []
    for gamma in gammas:
        tau, cost = expected_tokens(alpha, gamma), step_cost(gamma, cost_ratio, verify_cost)
        predictions.append(Prediction("chain", gamma, gamma, tau, cost, tau / cost))
    return predictions


def predict_trees(
    accept_probs: Sequence[Sequence[float]],
    sizes: Iterable[int],
    cost_ratio: float,
    verify_cost: CostCurve | None = None,
) -> list[Prediction]:
    """One [`Prediction`] per tree size in `sizes`, each with the best tree of that size ([`best_tree`])."""
    sizes = list(sizes)
    if not sizes:
        return []
    order = best_tree(accept_probs, max(sizes))  # its first n nodes are the best tree of n nodes
    predictions = []
    for size in sizes:
        tree = order[:size]
        if len(tree) < size:
            raise ValueError(
                f"accept_probs allows at most {len(order)} nodes (depths x ranks), so no tree of {size} nodes; "
                "give more depths or ranks, or smaller sizes."
            )
        tau = tree_expected_tokens(tree, accept_probs)
        depth = tree_depth(tree)
        cost = step_cost(size, cost_ratio, verify_cost, draft_forwards=depth)
        predictions.append(Prediction("tree", depth, size, tau, cost, tau / cost, tree))
    return predictions


@dataclass(frozen=True)
class DevicePrediction:
    """Predictions for a target/draft pair on a device.

    Args:
        costs (`DeviceCosts`): the roofline's per-token time, cost ratio and verification curve.
        chain (`list[Prediction]`): one per draft length.
        trees (`list[Prediction]`): one per tree size (empty without per-rank acceptance figures).
    """

    costs: DeviceCosts
    chain: list[Prediction]
    trees: list[Prediction]

    def milliseconds_per_token(self, prediction: Prediction) -> float:
        """Predicted time per emitted token with `prediction`'s configuration."""
        return 1e3 * self.costs.target_seconds / prediction.expected_speedup


def predict_on_device(
    target: ModelSpec,
    draft: ModelSpec | None,
    device: Device,
    alpha: AcceptanceRates,
    gammas: Iterable[int] = range(0, 9),
    *,
    accept_probs: Sequence[Sequence[float]] | None = None,
    tree_sizes: Iterable[int] = (),
    batch_size: int = 1,
    context_length: int = 0,
) -> DevicePrediction:
    """Predicted speedup of each draft length (and tree size) for `target` drafted by `draft` on `device`.

    Args:
        target (`ModelSpec`): the verifying model.
        draft (`ModelSpec`, *optional*): the drafting model; `None` for a drafter that costs nothing.
        device (`Device`): the roofline, e.g. `DEVICES["h100"]`.
        alpha (`float` or sequence of `float`): acceptance rate of the chain, constant or by position.
        gammas (iterable of `int`): draft lengths to predict.
        accept_probs (sequence of sequences of `float`, *optional*): `[depth][rank]` acceptance
            probabilities for trees ([`~hf_specdec.simulator.tree`]).
        tree_sizes (iterable of `int`): tree sizes (drafted nodes) to predict with `accept_probs`.
        batch_size (`int`): rows decoded together (the math grows with it, the weight traffic does not).
        context_length (`int`): tokens in the KV cache, for models with `kv_bytes_per_token`.
    """
    gammas, tree_sizes = list(gammas), list(tree_sizes)
    if tree_sizes and accept_probs is None:
        raise ValueError("Tree sizes need accept_probs: per-depth, per-rank acceptance probabilities.")
    most_tokens = max([*gammas, *tree_sizes, 1]) + 1
    costs = device_costs(
        target, draft, device, max_tokens=most_tokens, batch_size=batch_size, context_length=context_length
    )
    chain = predict_chain(alpha, gammas, costs.cost_ratio, costs.verify_cost)
    trees = predict_trees(accept_probs, tree_sizes, costs.cost_ratio, costs.verify_cost) if tree_sizes else []
    return DevicePrediction(costs, chain, trees)
