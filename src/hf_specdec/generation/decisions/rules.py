"""The adaptive rules: how far to draft, how deep to grow a tree, how many nodes to verify, which drafter to use.

Each rule asks one question, `CostModel.pays`: is one more drafted token (tree node, depth) expected to bring at
least its cost in plain steps times the rate recent steps brought? The rules differ only in where the expected
gain comes from, which the drafters supply: a draft model's confidence along its chain, a tree's path
probabilities, prompt lookup's acceptance measured by draft position. In a batch the gain that counts is the least
advanced rows' (`lagging_mean`): a batched call ends with its last row, so tokens for rows ahead of it barely
shorten it.
"""

from __future__ import annotations

import torch

from hf_specdec.generation.decisions.costs import CostModel
from hf_specdec.trees.dynamic import GrowthRule


def lagging_mean(gains: torch.Tensor, lagging: torch.Tensor | None) -> torch.Tensor:
    """The mean of per-row `gains` `(A,)` over the least advanced rows (`lagging` `(A,)`, see
    `TokenBuffer.lagging`; every row when `None`), on the device: the gain a batch's decision weighs."""
    if lagging is None:
        return gains.mean()
    weights = lagging.to(gains.dtype)
    return (gains * weights).sum() / weights.sum()


def next_draft_pays(costs: CostModel, gains: torch.Tensor, lagging: torch.Tensor | None) -> bool:
    """Whether a draft model's next forward pays: `gains` `(A,)` is each row's chance that every draft so far and
    the next one are accepted (its confidence multiplied along the chain); one draft forward and one more
    verified token per row to pay for. One read, none where the draft costs nothing."""
    return costs.pays(lambda: float(lagging_mean(gains, lagging)), gains.numel(), draft_forwards=1)


def growth_rule(costs: CostModel, lagging: torch.Tensor, rows: int, draft_forwards: int = 1) -> GrowthRule:
    """Whether a tree grows one more depth: it is expected to bring the chance that the accepted path reaches the
    new frontier times the chance it goes one further (taken as the ratio of the two latest frontiers' reach),
    averaged over the least advanced rows; it pays for `draft_forwards` drafter forwards and one more verified
    token per row. One read per depth, none where a depth costs nothing."""

    def keep_growing(previous_scores: torch.Tensor, frontier_scores: torch.Tensor) -> bool:
        def gain() -> float:
            reach = frontier_scores.exp().sum(dim=1)  # (A,) P(the accepted path reaches the new frontier)
            ratio = reach / previous_scores.exp().sum(dim=1).clamp_min(1e-9)
            return float(lagging_mean(reach * ratio.clamp_max(1.0), lagging))

        return costs.pays(gain, rows, draft_forwards)

    return keep_growing


def shared_width(survivals: list[list[float]], lagging: list[bool] | None, cost: float, step_cost: float = 0.0) -> int:
    """How many tokens per row a batch should verify, when row b's j-th draft would be accepted (with all
    earlier ones) with chance `survivals[b][j]` and every row is verified to the same width (shorter rows are
    padded, and padding costs as much as drafts): widen while one more position is expected to bring, averaged
    over the least advanced rows (`lagging`, host values; every row when `None`), at least `cost` tokens
    (`CostModel.threshold` with no draft forward); and none at all (a plain step) unless the positions together
    also bring `step_cost` (`CostModel.step_threshold`: what any step that verifies drafts costs more)."""
    if lagging is not None:
        survivals = [curve for curve, lags in zip(survivals, lagging, strict=True) if lags]
    rows, width, surplus = max(len(survivals), 1), 0, 0.0
    for position in range(max((len(curve) for curve in survivals), default=0)):
        gain = sum(curve[position] for curve in survivals if len(curve) > position) / rows
        if gain < cost:
            break
        width, surplus = position + 1, surplus + gain - cost
    return width if surplus >= step_cost else 0


def nodes_worth_verifying(scores: torch.Tensor, num_nodes: int, lagging: list[bool], cost: float) -> int:
    """How many of a grown pool's best nodes to verify, at most `num_nodes` and at least one: every row verifies
    the same number (the trees are padded to one width, and padding costs as much as nodes), so the count grows
    while the next node is expected to bring, averaged over the least advanced rows, at least `cost` tokens
    (`shared_width` over nodes). A node brings a token when its whole path is accepted, which its score estimates
    (the drafter's probability of the path, `scores` `(A, pool)`, the root first). One read."""
    count = min(num_nodes, scores.shape[1] - 1)
    if cost <= 0.0 or count <= 1:
        return max(count, 1)
    best = scores[:, 1:].topk(count, dim=1).values.exp()  # (A, count) path probabilities, best first
    return max(shared_width(best.tolist(), lagging, cost), 1)


def lookup_pays_more(
    costs: CostModel,
    rows: int,
    lookup_tokens: float,
    lookup_width: int,
    model_tokens: float,
    model_drafts: float,
) -> bool:
    """Whether a prompt-lookup step is expected to bring more tokens per unit of cost than a draft-model step:
    the lookup's `lookup_tokens` per row for verifying `lookup_width` drafts per row, against the draft model's
    recent `model_tokens` per row for `model_drafts` draft forwards and as many verified drafts.

    A lookup step also leaves the draft model behind by the tokens it commits, which the draft feeds at its next
    forward: about `lookup_tokens - 1` more tokens per row than after a step of its own, each taken to cost the
    draft what one more verified token costs the target, in proportion (`c * v` per row)."""
    catch_up = costs.draft_forward * costs.verify_per_token * rows * max(lookup_tokens - 1.0, 0.0)
    lookup_rate = lookup_tokens / (costs.step(0, rows, 1 + lookup_width) + catch_up)
    model_rate = model_tokens / costs.step(model_drafts, rows, 1 + model_drafts)
    return lookup_rate > model_rate
