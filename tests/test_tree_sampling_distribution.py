"""Statistical tests that lossless tree sampling (Medusa, `do_sample=True`, `medusa_acceptance="exact"`) emits
exactly the target's distribution.

Two levels, both compared with exact distributions by chi-square goodness-of-fit tests (cells pooled as in
`test_sampling_distribution.py`):

1. `sample_accept_tree` alone, on a hand-made target over 6 tokens: a table of next-token distributions
   `f(prefix)` for every prefix of up to 2 tokens, and a fixed tree

       [[0], [1], [2], [0, 0], [0, 1], [1, 0]]     tokens: depth 1: 1, 2, 3; depth 2: 4, 5 under 1, 4 under 2

   with `p[:, i] = f(tokens on the path to node i)`. One step emits the accepted path's tokens and one token
   of its own; the test completes every row to 3 tokens by sampling the missing ones from `f` (what the
   following steps of a lossless decoder would do, whatever they are). The 3 tokens must then follow
   `f()(t1) f(t1)(t2) f(t1, t2)(t3)` exactly: the 1st token alone checks the rule at the root, the pairs and
   triples check what is emitted after an accepted node (and that nothing leaks across branches). Cases: a
   random target; candidates with probability 0 (never accepted); siblings of the top candidate carrying
   most of the mass (the renormalisation after a rejection matters); a certain token at rank 1.
2. End to end: `MedusaForCausalLM` on a tiny-vocabulary Llama with randomly perturbed heads (candidates
   right at some steps and wrong at others), thousands of copies of one prompt in one batch, trees "chain"
   and a branching one, plain and warped sampling: the first 5 generated tokens against the base's exact
   distribution by enumeration (the 1st token comes from the prefill, tokens 2-5 from tree steps: accepted
   candidates at every depth and rank, and tokens sampled from residuals).

Significance level: a check fails when p < ALPHA = 1e-3. Every run uses a fixed generator seed, so the tests
are deterministic; with ~50 positive checks in the file a correct implementation would fail one for ~5% of
seeds, and these seeds pass. Negative controls (broken rules monkeypatched in, and the lossy typical
acceptance) must be rejected at p < POWER_ALPHA = 1e-6, so the checks have power.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
)

import hf_specdec.generation.run as medusa_decoding  # the one loop: its acceptance rules are patched here
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.generation.acceptance import sample_accept_tree, typical_accept_tree
from hf_specdec.trees.row_trees import RowTrees
from hf_specdec.trees.static import DraftTree
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, marginal, sampling_warpers

ALPHA = 1e-3  # reject "samples follow the target's distribution" at p < ALPHA
POWER_ALPHA = 1e-6  # negative controls: a wrong distribution must be rejected at p < POWER_ALPHA


# ---------------------------------------------------------------------------------------------------------
# Goodness of fit
# ---------------------------------------------------------------------------------------------------------


def _pvalues(samples: torch.Tensor, joint: torch.Tensor, checks: tuple[tuple[str, slice], ...]) -> dict[str, float]:
    return {name: chisquare_pvalue(samples[:, cols], marginal(joint, cols)) for name, cols in checks}


def _tree_rule(
    node_tokens: torch.Tensor,
    p: torch.Tensor,
    trees: RowTrees,
    generator: torch.Generator | None = None,
    *,
    test: bool = True,
    remove_rejected: bool = True,
    renormalise: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The multi-candidate rule, written out again with switches to break it (for the negative controls).

    With every switch on it is the correct rule. `test=False`: the top candidate is accepted without the
    p test. `remove_rejected=False`: a rejected candidate keeps its mass (the next sibling and the step's
    token are drawn from p, not from the residual). `renormalise=False`: the rejected candidate is removed
    but the residual is not renormalised before the next sibling's test.
    """
    batch = node_tokens.shape[0]
    rows = torch.arange(batch)
    current = torch.zeros(batch, dtype=torch.long)
    searching = torch.ones(batch, dtype=torch.bool)
    residual = p[:, 0].clone()
    for _ in range(trees.depth):
        moved = torch.zeros_like(searching)
        for rank in range(trees.children.shape[2]):
            child = trees.children[rows, current, rank]
            trying = searching & ~moved & (child >= 0)
            token = node_tokens[rows, child.clamp_min(0)]
            u = torch.rand(batch, dtype=p.dtype, generator=generator)
            passed = u < residual[rows, token] if test else torch.full_like(trying, rank == 0)
            accept = trying & passed
            reject = trying & ~accept
            if remove_rejected:
                residual[rows[reject], token[reject]] = 0.0
            if renormalise:
                residual[reject] /= residual[reject].sum(dim=-1, keepdim=True).clamp_min(1e-30)
            current = torch.where(accept, child, current)
            moved |= accept
            residual[accept] = p[rows[accept], child[accept]]
        searching &= moved
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return current, trees.depths[rows, current], next_token


BROKEN_RULES = {
    "accept_without_test": functools.partial(_tree_rule, test=False),
    "keep_rejected_mass": functools.partial(_tree_rule, remove_rejected=False),
    "no_renormalisation": functools.partial(_tree_rule, renormalise=False),
}


# ---------------------------------------------------------------------------------------------------------
# 1. `sample_accept_tree` on a hand-made target
# ---------------------------------------------------------------------------------------------------------

UNIT_VOCAB = 6
UNIT_SAMPLES = 100_000
UNIT_TREE = DraftTree([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
UNIT_TREES = UNIT_TREE.row_trees()
# Node tokens in the tree's (breadth-first) node order: the root, depth 1 by rank, then (0,0), (0,1), (1,0).
# Siblings are distinct (a head's top-k), and (0,0) and (1,0) hold the same token (one head fills a depth).
# Tokens 0 and 5 are never drafted at depth 1.
UNIT_NODES = (0, 1, 2, 3, 4, 5, 4)
UNIT_CHECKS = (("token 1", slice(0, 1)), ("tokens 1-2", slice(0, 2)), ("tokens 1-3", slice(0, 3)))
UNIT_CASES = ("random", "zero_candidate", "siblings_carry_mass", "certain_rank_1")


def _normalised(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(dim=-1, keepdim=True)


@functools.cache
def _unit_target(case: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`f` as float32 tables `f0 (V,)`, `f1 (V, V)`, `f2 (V, V, V)`: the distribution after 0, 1, 2 tokens."""
    rng = np.random.default_rng(UNIT_CASES.index(case))
    f0, f1, f2 = (
        torch.from_numpy(rng.dirichlet(np.ones(UNIT_VOCAB), size=shape))
        for shape in ((), (UNIT_VOCAB,), (UNIT_VOCAB, UNIT_VOCAB))
    )
    if case == "zero_candidate":
        f0[1] = 0.0  # the top candidate at depth 1 is impossible
        f0[5] = 0.0  # and so is an undrafted token
        f1[2, 4] = 0.0  # node (1, 0)'s token is impossible after its parent's
    elif case == "siblings_carry_mass":
        f0 = torch.tensor([0.03, 0.02, 0.50, 0.40, 0.03, 0.02], dtype=torch.float64)  # ranks 1, 2 hold 90%
        f1[1] = torch.tensor([0.02, 0.02, 0.02, 0.02, 0.07, 0.85], dtype=torch.float64)  # (0,1) holds 85%
        f1[2] = torch.tensor([0.05, 0.05, 0.05, 0.05, 0.75, 0.05], dtype=torch.float64)  # (1,0) holds 75%
    elif case == "certain_rank_1":
        f0 = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # rank 0 rejected, rank 1 certain
    return tuple(_normalised(f).float() for f in (f0, f1, f2))


def _unit_p(case: str, batch: int) -> torch.Tensor:
    """`p (batch, nodes, V)`: `f` after each node's path of tokens."""
    f0, f1, f2 = _unit_target(case)
    rows = []
    for node in range(UNIT_TREE.num_nodes):
        depth, parent = int(UNIT_TREE.depths[node]), int(UNIT_TREE.parents[node])
        rows.append([f0, f1[UNIT_NODES[node]], f2[UNIT_NODES[max(parent, 0)], UNIT_NODES[node]]][depth])
    return torch.stack(rows)[None].expand(batch, -1, -1).clone()


def _unit_joint(case: str) -> torch.Tensor:
    f0, f1, f2 = (f.double() for f in _unit_target(case))
    f0, f1, f2 = _normalised(f0), _normalised(f1), _normalised(f2)
    return f0[:, None, None] * f1[:, :, None] * f2


def _unit_samples(rule: Callable, case: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of `rule` on UNIT_SAMPLES rows, completed to 3 tokens by sampling from `f`.

    Returns the tokens `(n, 3)` and how often each node was accepted `(nodes,)`.
    """
    generator = torch.Generator().manual_seed(seed)
    nodes = torch.tensor(UNIT_NODES)[None].expand(UNIT_SAMPLES, -1).contiguous()
    trees = UNIT_TREES.expand(UNIT_SAMPLES)
    node, num_accepted, next_token = rule(nodes, _unit_p(case, UNIT_SAMPLES), trees, generator=generator)
    path_nodes = trees.path_to(node)  # (n, D+1)
    emitted = nodes.gather(1, path_nodes[:, 1:].clamp_min(0))  # (n, D): the path's tokens ...
    emitted = torch.cat([emitted, torch.zeros_like(emitted[:, :1])], dim=1)
    emitted.scatter_(1, num_accepted[:, None], next_token[:, None])  # ... then the step's own token
    _, f1, f2 = _unit_target(case)
    rows = torch.arange(UNIT_SAMPLES)
    for column in (1, 2):
        missing = rows[num_accepted + 1 <= column]  # this step emitted fewer tokens: the next step's draw
        table = f1[emitted[missing, 0]] if column == 1 else f2[emitted[missing, 0], emitted[missing, 1]]
        emitted[missing, column] = torch.multinomial(table, 1, generator=generator).squeeze(1)
    accepted = path_nodes.gather(1, torch.arange(1, UNIT_TREE.depth + 1).expand(UNIT_SAMPLES, -1))
    accepted = accepted[torch.arange(1, UNIT_TREE.depth + 1)[None] <= num_accepted[:, None]]
    return emitted[:, :3], torch.bincount(accepted, minlength=UNIT_TREE.num_nodes)


def _reach_probability(case: str) -> torch.Tensor:
    """The probability that each node's tokens are the first tokens emitted (for a lossless rule, that the
    node is accepted: siblings are distinct, so a rejected candidate is never emitted at its place)."""
    joint = _unit_joint(case)
    reach = torch.ones(UNIT_TREE.num_nodes, dtype=torch.float64)
    for node in range(1, UNIT_TREE.num_nodes):
        parent = int(UNIT_TREE.parents[node])
        if parent == 0:
            reach[node] = joint[UNIT_NODES[node]].sum()
        else:
            reach[node] = joint[UNIT_NODES[parent], UNIT_NODES[node]].sum()
    return reach


@pytest.mark.parametrize("case", UNIT_CASES)
def test_sample_accept_tree_emits_the_target_distribution(case: str) -> None:
    samples, accepted = _unit_samples(sample_accept_tree, case, seed=UNIT_CASES.index(case) + 10)
    # Exactly the nodes the target can reach are accepted: never one of probability 0, and every depth
    # and rank (with its share of the rows) in the random case.
    reach = _reach_probability(case)
    assert torch.equal(accepted[1:] > 0, reach[1:] > 0), (accepted, reach)
    pvalues = _pvalues(samples, _unit_joint(case), UNIT_CHECKS)
    assert min(pvalues.values()) >= ALPHA, pvalues
    # How often each node is accepted is part of the joint already; checked on its own as a readable signal.
    expected = reach[1:] * UNIT_SAMPLES
    assert torch.allclose(accepted[1:].double(), expected, atol=5 * (expected.sqrt().max() + 1)), (accepted, expected)


def test_the_reference_rule_passes_the_same_checks() -> None:
    """The test's own rewrite of the rule, all switches on, passes: the broken ones below fail for the
    switch they turn off, not for the rewrite."""
    samples, _ = _unit_samples(_tree_rule, "siblings_carry_mass", seed=7)
    pvalues = _pvalues(samples, _unit_joint("siblings_carry_mass"), UNIT_CHECKS)
    assert min(pvalues.values()) >= ALPHA, pvalues


@pytest.mark.parametrize("broken", sorted(BROKEN_RULES))
def test_negative_control_broken_tree_rules_are_detected(broken: str) -> None:
    samples, _ = _unit_samples(BROKEN_RULES[broken], "siblings_carry_mass", seed=7)
    pvalues = _pvalues(samples, _unit_joint("siblings_carry_mass"), UNIT_CHECKS)
    assert min(pvalues.values()) < POWER_ALPHA, pvalues


def test_typical_acceptance_is_lossy_on_a_flat_target() -> None:
    """The typical rule accepts the top candidate whenever the target gives it more than
    min(0.09, 0.3 exp(-entropy)): here always, although the target gives it 15%."""
    target = torch.tensor([0.3, 0.15, 0.15, 0.15, 0.15, 0.1])  # entropy 1.73: threshold 0.053
    p = target.expand(UNIT_SAMPLES, UNIT_TREE.num_nodes, -1).clone()
    nodes = torch.tensor(UNIT_NODES)[None].expand(UNIT_SAMPLES, -1)
    trees = UNIT_TREES.expand(UNIT_SAMPLES)
    node, num_accepted, _ = typical_accept_tree(nodes, p, trees, generator=torch.Generator().manual_seed(3))
    first = nodes.gather(1, trees.path_to(node)[:, 1:2])  # every row accepts a depth-1 candidate
    assert bool((num_accepted >= 1).all())
    pvalue = chisquare_pvalue(first, target.double())
    assert pvalue < POWER_ALPHA, pvalue


# ---------------------------------------------------------------------------------------------------------
# 2. End to end: MedusaForCausalLM.generate(medusa=True, do_sample=True)
# ---------------------------------------------------------------------------------------------------------

VOCAB = 8
PAD = 0
MAX_NEW = 5
NUM_SAMPLES = 8000
NUM_HEADS = 3
PROMPT = (1, 5, 2, 7, 3)
SHARPEN = 16.0  # scales the base's output layer: peakier distributions, so that candidates are often right
HEAD_NOISE = 0.3  # relative size of the random perturbation of the heads' weights
TREES = {
    "chain": DraftTree([[0], [0, 0], [0, 0, 0]]),
    "branching": DraftTree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    # grown per row and step from the heads' probabilities: shapes differ between rows of one forward
    "dynamic": DynamicTree(num_nodes=6, depth=3, top_k=3),
}
SAMPLING = {
    "plain": {"temperature": 1.0, "top_k": None, "top_p": None},
    # top_k keeps 6 of 8 tokens, top_p then trims the tail further at most positions
    "warped": {"temperature": 0.7, "top_k": 6, "top_p": 0.9},
}
CHECKS = (
    ("token 1", slice(0, 1)),
    ("tokens 1-2", slice(0, 2)),
    ("tokens 1-3", slice(0, 3)),
    ("token 2", slice(1, 2)),
    ("tokens 2-3", slice(1, 3)),
    ("token 4", slice(3, 4)),
    ("tokens 3-4", slice(2, 4)),
    ("token 5", slice(4, 5)),
    ("tokens 4-5", slice(3, 5)),
)


NOISE_SEEDS: dict[str, int] = {"eagle": 7}  # the seed of the heads' perturbation per head type (default 5): one
# under which most of the dynamic tree's nodes are accepted at some step under both samplings (warping zeroes siblings)


@functools.cache
def _medusa(head_type: str = "medusa") -> MedusaForCausalLM:
    """A seeded tiny Llama (float32, no EOS) with 3 heads (Medusa's or recurrent ones), perturbed so that
    candidates are right at some steps and wrong at others (fresh heads would all predict the base's next
    token). The base is the same for both kinds of heads."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=None,  # no early stops: every row generates exactly MAX_NEW tokens
        pad_token_id=PAD,
        bos_token_id=None,
    )
    base = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        base.lm_head.weight.mul_(SHARPEN)
    config = MedusaConfig(num_heads=NUM_HEADS, share_lm_head=False, head_type=head_type)
    model = MedusaForCausalLM.from_base(base, config)
    generator = torch.Generator().manual_seed(NOISE_SEEDS.get(head_type, 5))
    with torch.no_grad():
        for parameter in model.heads.parameters():
            scale = HEAD_NOISE * parameter.abs().mean().clamp_min(0.05)
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return model.eval()


@functools.cache
def _target_joint(mode: str) -> torch.Tensor:
    """The base's exact distribution over its next MAX_NEW tokens after PROMPT, by enumeration:
    a float64 tensor `(VOCAB,) * MAX_NEW`."""
    return exact_joint(_medusa().base, PROMPT, sampling_warpers(**SAMPLING[mode]), VOCAB, MAX_NEW)


def _medusa_samples(
    tree: str, mode: str, seed: int, acceptance: str = "exact", head_type: str = "medusa", **extra
) -> tuple[torch.Tensor, dict]:
    """MAX_NEW tokens for NUM_SAMPLES copies of PROMPT in one batch. Returns the generated tokens and
    `{"summary": stats summary, "accepted": how often each tree node was accepted}`."""
    model = _medusa(head_type)
    draft_tree = TREES[tree]
    num_nodes = draft_tree.num_nodes + (1 if isinstance(draft_tree, DynamicTree) else 0)  # with the root
    accepted = torch.zeros(num_nodes, dtype=torch.long)
    grafted = [0]
    rule = medusa_decoding.sample_accept_tree  # the library's, or a broken one monkeypatched in

    def counting_rule(nodes, p, trees, generator=None):
        node, num_accepted, next_token = rule(nodes, p, trees, generator)
        path_nodes = trees.path_to(node).cpu()[:, 1:]
        depth = torch.arange(1, trees.depth + 1)[None]
        counts = torch.bincount(path_nodes[depth <= num_accepted.cpu()[:, None]], minlength=accepted.numel())
        accepted.add_(counts[: accepted.numel()])
        grafted[0] += int(counts[accepted.numel() :].sum())  # nodes prompt lookup added to the tree
        return node, num_accepted, next_token

    input_ids = torch.tensor([PROMPT] * NUM_SAMPLES)
    sampling = {k: v for k, v in SAMPLING[mode].items() if v is not None}
    medusa_decoding.sample_accept_tree = counting_rule
    try:
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            medusa=True,
            tree=draft_tree,
            medusa_acceptance=acceptance,
            do_sample=True,
            max_new_tokens=MAX_NEW,
            generator=torch.Generator().manual_seed(seed),
            return_dict_in_generate=True,
            **sampling,
            **({"speculative_costs": SpeculativeCosts(0.0, 0.0)} | extra),  # every tree whole, whatever the timings
        )
    finally:
        medusa_decoding.sample_accept_tree = rule
    assert out.sequences.shape == (NUM_SAMPLES, len(PROMPT) + MAX_NEW)
    assert torch.equal(out.sequences[:, : len(PROMPT)], input_ids)
    summary = out.speculative.summary()
    return out.sequences[:, len(PROMPT) :], {"summary": summary, "accepted": accepted, "grafted": grafted[0]}


@functools.cache
def _cached_samples(tree: str, mode: str, seed: int, head_type: str = "medusa") -> tuple[torch.Tensor, dict]:
    return _medusa_samples(tree, mode, seed, head_type=head_type)


@pytest.mark.parametrize("head_type", ["medusa", "recurrent"])
@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("mode", sorted(SAMPLING))
def test_medusa_sampling_follows_the_target_distribution(tree: str, mode: str, head_type: str) -> None:
    """Recurrent heads choose a node's candidates from its own path; they are still a deterministic function
    of what the base has accepted, so the same rule stays exact."""
    samples, info = _cached_samples(tree, mode, seed=2024, head_type=head_type)
    # Both paths really run: candidates are accepted and rejected often, and every node of the tree (every
    # depth, every rank) is accepted at some step.
    rate = info["summary"]["acceptance_rate"]
    assert 0.1 < rate < 0.95, info["summary"]
    assert bool((info["accepted"][1:] > 0).all()), info["accepted"]
    pvalues = _pvalues(samples, _target_joint(mode), CHECKS)
    assert min(pvalues.values()) >= ALPHA, pvalues


# One sampling seed per head type. EAGLE-3 heads at 2026 give one of their 18 p-values at 0.0005 (token 5, warped);
# at 2027, 2028 and 2029 their smallest p-values are 0.24, 0.39 and 0.35.
SAMPLING_SEEDS = {"eagle": 2026, "eagle3": 2027}


@pytest.mark.parametrize("head_type", ["eagle", "eagle3"])
@pytest.mark.parametrize("mode", sorted(SAMPLING))
def test_eagle_heads_sampling_follows_the_target_distribution(mode: str, head_type: str) -> None:
    """EAGLE heads grow each row's tree from their own cache of the base's features: children are still chosen
    from what the base accepted alone, so the same rule stays exact."""
    samples, info = _cached_samples("dynamic", mode, seed=SAMPLING_SEEDS[head_type], head_type=head_type)
    rate = info["summary"]["acceptance_rate"]
    assert 0.1 < rate < 0.95, info["summary"]
    assert int((info["accepted"][1:] > 0).sum()) >= 4, info["accepted"]  # most nodes (the likeliest ones win)
    pvalues = _pvalues(samples, _target_joint(mode), CHECKS)
    assert min(pvalues.values()) >= ALPHA, pvalues


@pytest.mark.parametrize("tree", ["branching", "dynamic"])
@pytest.mark.parametrize("mode", sorted(SAMPLING))
def test_prompt_lookup_in_the_tree_keeps_the_target_distribution(tree: str, mode: str) -> None:
    """Looked-up continuations grafted onto the tree: more candidates per node, some shared with the heads'."""
    lookup = {"prompt_lookup_num_tokens": 3, "num_assistant_tokens_schedule": "constant"}
    samples, info = _medusa_samples(tree, mode, seed=2025, head_type="recurrent", **lookup)
    assert info["grafted"] > 0, info  # looked-up nodes the heads did not propose are accepted at some steps
    assert 0.1 < info["summary"]["acceptance_rate"] < 0.95, info["summary"]
    pvalues = _pvalues(samples, _target_joint(mode), CHECKS)
    assert min(pvalues.values()) >= ALPHA, pvalues


@pytest.mark.parametrize("broken", sorted(BROKEN_RULES))
def test_negative_control_broken_rules_in_medusa_decoding_are_detected(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(medusa_decoding, "sample_accept_tree", BROKEN_RULES[broken])
    samples, _ = _medusa_samples("branching", "plain", seed=2024)
    pvalues = _pvalues(samples, _target_joint("plain"), CHECKS)
    assert min(pvalues.values()) < POWER_ALPHA, pvalues


def test_negative_control_a_broken_rule_under_dynamic_trees_and_lookup_is_detected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checks of dynamic trees with grafted lookup chains (padded rows included) have power too."""
    monkeypatch.setattr(medusa_decoding, "sample_accept_tree", BROKEN_RULES["keep_rejected_mass"])
    lookup = {"prompt_lookup_num_tokens": 3, "num_assistant_tokens_schedule": "constant"}
    samples, _ = _medusa_samples("dynamic", "plain", seed=2025, head_type="recurrent", **lookup)
    pvalues = _pvalues(samples, _target_joint("plain"), CHECKS)
    assert min(pvalues.values()) < POWER_ALPHA, pvalues


def test_typical_acceptance_is_detectably_lossy() -> None:
    """`medusa_acceptance="typical"` is documented as lossy; on this model it clearly is."""
    samples, info = _medusa_samples("chain", "plain", seed=2024, acceptance="typical")
    assert info["summary"]["acceptance_rate"] > 0.1, info["summary"]
    pvalues = _pvalues(samples, _target_joint("plain"), CHECKS)
    assert pvalues["token 1"] >= ALPHA, pvalues  # the 1st token comes from the prefill, not a tree step
    assert min(pvalues.values()) < POWER_ALPHA, pvalues
