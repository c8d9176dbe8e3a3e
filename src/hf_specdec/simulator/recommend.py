"""The best draft length or tree size for given acceptance figures and costs.

Draft length 0 (plain decoding) is always a candidate: when drafting costs more than it brings, the
recommendation says so instead of picking the least bad draft length.
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_specdec.simulator.closed_form import AcceptanceRates
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.predict import Prediction, predict_chain, predict_trees
from hf_specdec.simulator.tree import tree_capacity
from hf_specdec.simulator.validation import check_draft_length


def best(predictions: Sequence[Prediction]) -> Prediction:
    """The prediction with the highest expected speedup; on a tie the first (the cheaper, as sweeps go up)."""
    if not predictions:
        raise ValueError("No predictions to choose from: pass at least one draft length or tree size.")
    return max(predictions, key=lambda p: p.expected_speedup)  # max keeps the first of equal keys


def recommend_draft_length(
    alpha: AcceptanceRates, cost_ratio: float, verify_cost: CostCurve | None = None, max_gamma: int = 16
) -> Prediction:
    """The draft length in 0..`max_gamma` with the highest expected speedup.

    Args:
        alpha (`float` or sequence of `float`): acceptance rate, constant or by position (then at least
            `max_gamma` entries).
        cost_ratio (`float`): c, a draft forward's cost in target forwards.
        verify_cost (`CostCurve`, *optional*): V(n); flat when `None`.
        max_gamma (`int`): the longest draft to consider.
    """
    max_gamma = check_draft_length(max_gamma)
    return best(predict_chain(alpha, range(0, max_gamma + 1), cost_ratio, verify_cost))


def recommend_tree(
    accept_probs: Sequence[Sequence[float]],
    cost_ratio: float,
    verify_cost: CostCurve | None = None,
    max_nodes: int = 64,
) -> Prediction:
    """The tree size in 1..`max_nodes` (with the best tree of each size) with the highest expected speedup.

    Args:
        accept_probs (sequence of sequences of `float`): `[depth][rank]` acceptance probabilities.
        cost_ratio (`float`): one draft forward's cost in target forwards (one forward per tree level).
        verify_cost (`CostCurve`, *optional*): V(n); flat when `None`, which makes the largest tree win.
        max_nodes (`int`): the largest tree to consider (capped by what `accept_probs` allows).
    """
    max_nodes = check_draft_length(max_nodes, minimum=1)
    most = min(max_nodes, tree_capacity(accept_probs))
    if most < 1:
        raise ValueError("accept_probs allows no tree: give at least one depth with one rank.")
    return best(predict_trees(accept_probs, range(1, most + 1), cost_ratio, verify_cost))
