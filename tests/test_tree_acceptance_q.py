"""Statistical tests that `sample_accept_tree` with a draft distribution q (children drawn from q without
replacement, several per node) emits exactly the target's distribution, and so do the chain rules built on it.

A hand-made target over 6 tokens: next-token tables `f(prefix)` for every prefix of up to 2 tokens, and a draft
with its own tables `g(prefix)`. The tree

    root: 3 children (nodes 1, 2, 3), drawn from g() without replacement
    node 1: 2 children (4, 5), node 2: 2 children (6, 7), node 3: 1 child (8), drawn from g(their path)

is drawn afresh for every row, `p[:, i] = f(path to i)` and `q[:, i] = g(path to i)`. One step emits the
accepted path and one token of its own; each row is completed to 3 tokens by sampling the missing ones from `f`
(what the next steps of any lossless decoder would do). The 3 tokens must follow `f()(t1) f(t1)(t2)
f(t1, t2)(t3)` exactly: the 1st token checks the rule at the root (all siblings rejected included), the
pairs and triples what is emitted after an accepted node. Chi-square goodness of fit, cells pooled as in
`tests/goodness_of_fit.py`; a check fails at p < ALPHA = 1e-3, with fixed seeds (deterministic).

Negative controls: the library's rule with one piece broken (monkeypatched: the rejected child kept in q, q
not renormalised, p instead of the residual) must be rejected at p < POWER_ALPHA = 1e-6 by the same checks.
Verifying sampled children as certain proposals (without q) is exact too, only slower: checked as such.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import hf_specdec.generation.acceptance as acceptance
from hf_specdec.generation.acceptance import point_draft_sampling, sample_accept_tree, speculative_sampling
from hf_specdec.trees.row_trees import RowTrees
from tests.goodness_of_fit import chisquare_pvalue, marginal

ALPHA = 1e-3
POWER_ALPHA = 1e-6
VOCAB = 6
SAMPLES = 100_000
PARENTS = (-1, 0, 0, 0, 1, 1, 2, 2, 3)
DEPTHS = (0, 1, 1, 1, 2, 2, 2, 2, 2)
TREES = RowTrees.from_parents(torch.tensor([PARENTS]))
GRAFT = 5  # "certain_graft": node 2 is this token, proposed with certainty; the draft never draws it at the root
CHECKS = (("token 1", slice(0, 1)), ("tokens 1-2", slice(0, 2)), ("tokens 1-3", slice(0, 3)))
CASES = ("random", "draft_overconfident", "target_rules_out_drafts", "certain_graft")

Tables = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _normalised(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(dim=-1, keepdim=True)


@functools.cache
def _tables(case: str) -> Tables:
    """float32 `(f0 (V,), f1 (V, V), f2 (V, V, V), g0 (V,), g1 (V, V))`: the target after 0, 1, 2 tokens and
    the draft after 0, 1 tokens."""
    rng = np.random.default_rng(100 + CASES.index(case))
    f0, f1, f2, g0, g1 = (
        torch.from_numpy(rng.dirichlet(np.ones(VOCAB), size=shape))
        for shape in ((), (VOCAB,), (VOCAB, VOCAB), (), (VOCAB,))
    )
    if case == "draft_overconfident":
        # The draft's favourites are the target's least likely tokens: rejections, residuals, later siblings.
        g0 = torch.tensor([0.45, 0.30, 0.12, 0.07, 0.04, 0.02], dtype=torch.float64)
        f0 = torch.tensor([0.04, 0.06, 0.30, 0.25, 0.20, 0.15], dtype=torch.float64)
        g1 = g0.expand(VOCAB, VOCAB).clone()
        f1 = f0.flip(0).roll(1).expand(VOCAB, VOCAB).clone()
    elif case == "target_rules_out_drafts":
        f0[0] = 0.0  # the draft's likeliest first token is impossible
        g0[0] = 0.5
        f1[:, 1] = 0.0
        g1[:, 1] = 0.5
    elif case == "certain_graft":
        g0[GRAFT] = 0.0
    return tuple(_normalised(t).float() for t in (f0, f1, f2, g0, g1))


def _joint(case: str) -> torch.Tensor:
    f0, f1, f2 = (_normalised(t.double()) for t in _tables(case)[:3])
    return f0[:, None, None] * f1[:, :, None] * f2


def _draw_tree(case: str, generator: torch.Generator) -> torch.Tensor:
    """`(SAMPLES, nodes)` node tokens: each node's children drawn from g after it, without replacement."""
    _, _, _, g0, g1 = _tables(case)
    tokens = torch.zeros(SAMPLES, len(PARENTS), dtype=torch.long)
    first = torch.multinomial(g0.expand(SAMPLES, -1), 2 if case == "certain_graft" else 3, generator=generator)
    if case == "certain_graft":  # sampled, certain, sampled: the draft's second draw comes after the graft
        first = torch.stack([first[:, 0], torch.full_like(first[:, 0], GRAFT), first[:, 1]], dim=1)
    tokens[:, 1:4] = first
    for parent, children in ((1, [4, 5]), (2, [6, 7]), (3, [8])):
        tokens[:, children] = torch.multinomial(g1[tokens[:, parent]], len(children), generator=generator)
    return tokens


def _p_q(case: str, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`p`, `q` `(n, nodes, V)` along each row's tree; q is zero at the leaves (never read)."""
    f0, f1, f2, g0, g1 = _tables(case)
    n = tokens.shape[0]
    p = torch.zeros(n, tokens.shape[1], VOCAB)
    q = torch.zeros_like(p)
    for node, (parent, depth) in enumerate(zip(PARENTS, DEPTHS, strict=True)):
        if depth == 0:
            p[:, node], q[:, node] = f0, g0
        elif depth == 1:
            p[:, node], q[:, node] = f1[tokens[:, node]], g1[tokens[:, node]]
        else:
            p[:, node] = f2[tokens[:, parent], tokens[:, node]]
    return p, q


def _completed(
    case: str, path: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """The step's tokens (the accepted path's `path` `(n, 2)`, then `next_token`), completed to 3 from f."""
    _, f1, f2, _, _ = _tables(case)
    emitted = torch.cat([path, torch.zeros_like(path[:, :1])], dim=1)
    emitted.scatter_(1, num_accepted[:, None], next_token[:, None])
    rows = torch.arange(emitted.shape[0])
    for column in (1, 2):
        missing = rows[num_accepted + 1 <= column]
        table = f1[emitted[missing, 0]] if column == 1 else f2[emitted[missing, 0], emitted[missing, 1]]
        emitted[missing, column] = torch.multinomial(table, 1, generator=generator).squeeze(1)
    return emitted[:, :3]


def _tree_samples(case: str, seed: int, with_q: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One step on SAMPLES freshly drawn trees. Returns the 3 tokens `(n, 3)` and each node's acceptance count."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _draw_tree(case, generator)
    p, q = _p_q(case, tokens)
    trees = TREES.expand(SAMPLES)
    node, num_accepted, next_token = sample_accept_tree(tokens, p, trees, generator, q=q if with_q else None)
    path_nodes = trees.path_to(node)[:, 1:]  # (n, 2)
    path = tokens.gather(1, path_nodes.clamp_min(0))
    samples = _completed(case, path, num_accepted, next_token, generator)
    accepted = path_nodes[torch.arange(1, 3)[None] <= num_accepted[:, None]]
    return samples, torch.bincount(accepted, minlength=len(PARENTS))


def _pvalues(samples: torch.Tensor, case: str) -> dict[str, float]:
    joint = _joint(case)
    return {name: chisquare_pvalue(samples[:, cols], marginal(joint, cols)) for name, cols in CHECKS}


@pytest.mark.parametrize("case", CASES)
def test_sampled_multi_child_trees_emit_the_target_distribution(case: str) -> None:
    samples, accepted = _tree_samples(case, seed=10 + CASES.index(case))
    # Every node (each rank at each depth) is accepted in some rows, and some rows reject all three at the root.
    assert bool((accepted[1:] > 0).all()), accepted
    assert int(accepted[1:4].sum()) < SAMPLES, accepted
    pvalues = _pvalues(samples, case)
    assert min(pvalues.values()) >= ALPHA, pvalues


def test_a_child_the_target_rules_out_is_never_accepted() -> None:
    generator = torch.Generator().manual_seed(4)
    tokens = _draw_tree("target_rules_out_drafts", generator)
    p, q = _p_q("target_rules_out_drafts", tokens)
    node, num_accepted, next_token = sample_accept_tree(tokens, p, TREES.expand(SAMPLES), generator, q=q)
    path = tokens.gather(1, TREES.expand(SAMPLES).path_to(node)[:, 1:].clamp_min(0))
    assert not bool(((num_accepted >= 1) & (path[:, 0] == 0)).any())  # f() gives token 0 nothing
    assert not bool(((num_accepted == 0) & (next_token == 0)).any())
    assert not bool(((num_accepted == 2) & (path[:, 1] == 1)).any())  # f(t) gives token 1 nothing


# ---------------------------------------------------------------------------------------------------------
# Chains: `speculative_sampling` (q) and `point_draft_sampling` (certain drafts, ragged lengths)
# ---------------------------------------------------------------------------------------------------------


def _chain_p_q(case: str, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    f0, f1, f2, g0, g1 = _tables(case)
    p = torch.stack([f0.expand(drafts.shape[0], -1), f1[drafts[:, 0]], f2[drafts[:, 0], drafts[:, 1]]], dim=1)
    return p, torch.stack([g0.expand(drafts.shape[0], -1), g1[drafts[:, 0]]], dim=1)


@pytest.mark.parametrize("case", ["random", "draft_overconfident"])
def test_speculative_sampling_on_a_chain_emits_the_target_distribution(case: str) -> None:
    generator = torch.Generator().manual_seed(20 + CASES.index(case))
    _, _, _, g0, g1 = _tables(case)
    first = torch.multinomial(g0.expand(SAMPLES, -1), 1, generator=generator).squeeze(1)
    drafts = torch.stack([first, torch.multinomial(g1[first], 1, generator=generator).squeeze(1)], dim=1)
    p, q = _chain_p_q(case, drafts)
    num_accepted, next_token = speculative_sampling(drafts, q, p, generator)
    assert set(num_accepted.unique().tolist()) == {0, 1, 2}
    pvalues = _pvalues(_completed(case, drafts, num_accepted, next_token, generator), case)
    assert min(pvalues.values()) >= ALPHA, pvalues


def test_point_draft_sampling_with_ragged_lengths_emits_the_target_distribution() -> None:
    """Certain drafts (any fixed tokens: here the same two for every row), 0, 1 or 2 of them real per row."""
    case = "random"
    generator = torch.Generator().manual_seed(30)
    drafts = torch.tensor([[2, 4]]).expand(SAMPLES, -1)
    lengths = torch.randint(0, 3, (SAMPLES,), generator=generator)
    p, _ = _chain_p_q(case, drafts)
    num_accepted, next_token = point_draft_sampling(drafts, p, lengths, generator)
    assert bool((num_accepted <= lengths).all())
    assert set(num_accepted.unique().tolist()) == {0, 1, 2}
    pvalues = _pvalues(_completed(case, drafts, num_accepted, next_token, generator), case)
    assert min(pvalues.values()) >= ALPHA, pvalues


# ---------------------------------------------------------------------------------------------------------
# Negative controls: the same checks reject broken rules
# ---------------------------------------------------------------------------------------------------------

BROKEN = {
    # the rejected child keeps its mass in q: later siblings are tested (and the residual taken) against q
    "rejected_child_kept_in_q": lambda q, token: q,
    # the rejected child is removed from q, which is not renormalised
    "q_not_renormalised": lambda q, token: q.scatter(1, token[:, None], 0.0),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_negative_control_broken_draft_update_is_detected(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acceptance, "_without_drafted", BROKEN[broken])
    samples, _ = _tree_samples("draft_overconfident", seed=11)
    pvalues = _pvalues(samples, "draft_overconfident")
    assert min(pvalues.values()) < POWER_ALPHA, pvalues


def test_negative_control_p_instead_of_the_residual_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q: p)
    samples, _ = _tree_samples("draft_overconfident", seed=11)
    pvalues = _pvalues(samples, "draft_overconfident")
    assert min(pvalues.values()) < POWER_ALPHA, pvalues


def test_certain_proposal_rule_on_sampled_children_is_exact_but_accepts_less() -> None:
    """Verifying sampled children as certain proposals (forgetting q) is not a broken rule: given the
    candidates, accept c with p(c) and otherwise draw from p without c emits p whatever chose them (it is
    also what a child that q gives no mass gets). It accepts less than the rule with q, which is why q is used."""
    samples, accepted_without_q = _tree_samples("random", seed=12, with_q=False)
    pvalues = _pvalues(samples, "random")
    assert min(pvalues.values()) >= ALPHA, pvalues
    _, accepted_with_q = _tree_samples("random", seed=12)
    assert int(accepted_with_q.sum()) > 1.2 * int(accepted_without_q.sum()), (accepted_with_q, accepted_without_q)
