"""Dynamic trees (`DynamicTree`) and the per-row tree structure (`RowTrees`) verification runs on: buffers by
hand, growth against a plain-Python rewrite, greedy identity with either kind of heads, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM
from hf_specdec.generation.acceptance import greedy_accept_tree
from hf_specdec.trees.row_trees import RowTrees
from hf_specdec.trees.static import preset_tree
from tests.test_medusa import _generate
from tests.test_recurrent_heads import _recurrent
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model

# ---------------------------------------------------------------------------------------------------------
# RowTrees
# ---------------------------------------------------------------------------------------------------------


def test_row_trees_by_hand() -> None:
    #   row 0: 0 -> 1 -> 3, 0 -> 2          row 1: a chain 0 -> 1 -> 2 -> 3
    trees = RowTrees.from_parents(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]))
    assert trees.depths.tolist() == [[0, 1, 1, 2], [0, 1, 2, 3]]
    assert trees.ancestors[0].long().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert trees.ancestors[1].long().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert trees.paths[0].tolist() == [[0, -1, -1, -1], [0, 1, -1, -1], [0, 2, -1, -1], [0, 1, 3, -1]]
    assert trees.paths[1, 3].tolist() == [0, 1, 2, 3]
    assert trees.children[0].tolist() == [[1, 2], [3, -1], [-1, -1], [-1, -1]]
    assert trees.children[1].tolist() == [[1, -1], [2, -1], [3, -1], [-1, -1]]
    assert trees.leaves.tolist() == [[False, False, True, True], [False, False, False, True]]
    assert trees.row_depths.tolist() == [2, 3] and trees.depth == 3
    assert trees.path_to(torch.tensor([3, 2])).tolist() == [[0, 1, 3, -1], [0, 1, 2, -1]]


@pytest.mark.parametrize("name", ["chain", "small", "medium", "xlarge"])
def test_row_trees_of_a_static_tree_match_its_buffers(name: str) -> None:
    tree = preset_tree(name, 4)
    trees = tree.row_trees().expand(3)
    assert trees.parents.shape == (3, tree.num_nodes)
    assert torch.equal(trees.ancestors[2], tree.ancestors)
    assert torch.equal(trees.depths[1], tree.depths)
    assert torch.equal(trees.children[0, :, : tree.children.shape[1]], tree.children)
    leaves = trees.leaves[0].nonzero().flatten()
    assert torch.equal(trees.paths[0, leaves], tree.paths)


@pytest.mark.parametrize(
    ("parents", "real", "message"),
    [
        ([[0, 0]], None, "root, with parent -1"),
        ([[-1, 1]], None, "smaller index"),
        ([[-1, 0, 3, 1]], None, "smaller index"),
        ([[-1, 5]], None, "smaller index"),
        ([[]], None, "root first"),
        ([[-1, 0, 1]], [[True, True, False]], "hang from the root"),
        ([[-1, 0, 1]], [[True, False, True]], "cannot have children"),
        ([[-1, 0, 0]], [[False, True, True]], "root is real"),
    ],
)
def test_row_trees_refuse_bad_structure(parents: list, real: list | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RowTrees.from_parents(
            torch.tensor(parents, dtype=torch.long), None if real is None else torch.tensor(real, dtype=torch.bool)
        )


def test_greedy_acceptance_with_a_different_tree_per_row() -> None:
    trees = RowTrees.from_parents(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]))
    nodes = torch.tensor([[5, 1, 2, 3], [5, 1, 2, 3]])
    # The target's argmax after each node: row 0 takes 2 after the root (node 2, a leaf), row 1 the chain to 2.
    predicted = torch.tensor([[2, 3, 4, 0], [1, 2, 0, 4]])
    scores = torch.nn.functional.one_hot(predicted, 6).float()
    node, num_accepted, next_token = greedy_accept_tree(nodes, scores, trees)
    assert node.tolist() == [2, 2] and num_accepted.tolist() == [1, 2] and next_token.tolist() == [4, 0]


# ---------------------------------------------------------------------------------------------------------
# Growing
# ---------------------------------------------------------------------------------------------------------

VOCAB = 6


def _table_logp(path: tuple[int, ...], row: int) -> torch.Tensor:
    """A fixed, peaky next-token distribution after every path (the drafter of the growth tests)."""
    generator = torch.Generator().manual_seed(hash((row, *path)) % 2**31)
    return torch.log_softmax(3.0 * torch.randn(VOCAB, generator=generator), dim=-1)


def _table_expander(batch: int):
    """An `Expander` over `_table_logp` that remembers every frontier node's path."""
    paths: list[list[tuple[int, ...]]] = [[()] for _ in range(batch)]

    def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
        nonlocal paths
        if parent_slot is not None:  # the frontier: each node's parent's path, plus its own token
            paths = [
                [(*paths[row][s], t) for s, t in zip(parent_slot[row].tolist(), tokens[row].tolist(), strict=True)]
                for row in range(batch)
            ]
        return torch.stack([torch.stack([_table_logp(p, row) for p in paths[row]]) for row in range(batch)])

    return expand


def _reference_growth(spec: DynamicTree, row: int) -> list[tuple[tuple[int, ...], float]]:
    """The same algorithm in plain Python: the chosen paths (below the root) and their scores."""
    pool: list[tuple[tuple[int, ...], float]] = []
    frontier: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    for _ in range(spec.depth):
        children = []
        for path, score in frontier:
            logp = _table_logp(path, row)
            values, tokens = logp.topk(spec.top_k)
            children += [((*path, t), score + v) for v, t in zip(values.tolist(), tokens.tolist(), strict=True)]
        pool += children
        frontier = sorted(children, key=lambda c: -c[1])[: spec.top_k]
    return sorted(pool, key=lambda c: -c[1])[: spec.num_nodes]


@pytest.mark.parametrize(
    "spec", [DynamicTree(8, 4, 3), DynamicTree(5, 2, 2), DynamicTree(12, 5, 4), DynamicTree(3, 1, 6)]
)
def test_growth_chooses_the_likeliest_paths(spec: DynamicTree) -> None:
    root = torch.tensor([0, 1])
    nodes, trees = spec.grow(root, _table_expander(2), lambda i: i)
    assert nodes.shape == (2, spec.num_nodes + 1) and torch.equal(nodes[:, 0], root)
    for row in range(2):
        paths = []
        for node in range(1, spec.num_nodes + 1):
            path = trees.path_to(torch.tensor([node]).expand(2))[row]
            paths.append(tuple(nodes[row, path[1:][path[1:] >= 0]].tolist()))
        expected = _reference_growth(spec, row)
        assert sorted(paths) == sorted(p for p, _ in expected)
        # Parents come before children, siblings best first.
        for node in range(1, spec.num_nodes + 1):
            assert int(trees.parents[row, node]) < node
        scores = {p: s for p, s in expected}
        for siblings in trees.children[row].tolist():
            kids = [paths[c - 1] for c in siblings if c >= 0]
            assert [scores[k] for k in kids] == sorted((scores[k] for k in kids), reverse=True)


def test_rows_grow_different_shapes() -> None:
    """A row with a sure next token grows a deep chain; a row with an open one, a wide fan."""
    sure = torch.log_softmax(torch.tensor([20.0, 0, 0, 0, 0, 0]), dim=-1)
    flat = torch.log_softmax(torch.zeros(VOCAB), dim=-1)

    def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
        return torch.stack([sure.expand(tokens.shape[1], -1), flat.expand(tokens.shape[1], -1)])

    _, trees = DynamicTree(num_nodes=6, depth=6, top_k=3).grow(torch.tensor([1, 1]), expand, lambda i: i)
    assert trees.row_depths.tolist() == [6, 2]
    assert trees.depths[1].tolist() == [0, 1, 1, 1, 2, 2, 2]
    assert math.isclose(float(trees.depths[0].float().mean()), 3.0)


def test_ties_keep_the_tree_connected() -> None:
    """Children as likely as their parents (probability 1 in float32): the parent is chosen first."""
    certain = torch.full((VOCAB,), -1e9)
    certain[2] = 0.0

    def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
        return certain.expand(tokens.shape[0], tokens.shape[1], -1)

    nodes, trees = DynamicTree(num_nodes=4, depth=4, top_k=2).grow(torch.tensor([0]), expand, lambda i: i)
    assert trees.parents[0].tolist() == [-1, 0, 1, 2, 3]
    assert nodes[0].tolist() == [0, 2, 2, 2, 2]


# ---------------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("head_type", ["medusa", "recurrent"])
def test_dynamic_trees_keep_plain_greedy(arch: str, batch: int, head_type: str) -> None:
    if head_type == "recurrent":
        model = _recurrent(arch, share_lm_head=arch != "gpt2")
        spec = DynamicTree(num_nodes=10, depth=5, top_k=3)  # deeper than the 3 depths it was built for
    else:
        base = tiny_model(arch, seed=0, sharpen=4.0)
        model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, share_lm_head=arch != "gpt2"))
        spec = DynamicTree(num_nodes=10, depth=3, top_k=3)
    ids, mask = ragged_batch(batch, seed=batch)
    assert torch.equal(_generate(model, ids, mask, medusa=True, tree=spec), _generate(model.base, ids, mask))


@pytest.mark.parametrize(
    "processing", [{"repetition_penalty": 1.5}, {"min_new_tokens": 12, "eos_token_id": 5}, {"no_repeat_ngram_size": 2}]
)
def test_prefix_reading_processors_under_dynamic_trees(processing: dict) -> None:
    model = _recurrent("llama", share_lm_head=False)
    ids, mask = ragged_batch(3, seed=2)
    spec = DynamicTree(num_nodes=8, depth=4, top_k=3)
    plain = _generate(model.base, ids, mask, **processing)
    assert torch.equal(_generate(model, ids, mask, medusa=True, tree=spec, **processing), plain)


def test_dynamic_tree_errors() -> None:
    base = tiny_model("llama", seed=0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2))
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="deeper than the 2 Medusa heads"):
        model.generate(ids, medusa=True, tree=DynamicTree(depth=3), max_new_tokens=4)
    token_ids = torch.arange(4)
    narrow = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2), token_ids=token_ids)
    with pytest.raises(ValueError, match="top_k"):
        narrow.generate(ids, medusa=True, tree=DynamicTree(depth=2, top_k=5), max_new_tokens=4)
    for bad in ({"num_nodes": 0}, {"depth": -1}, {"top_k": 2.5}, {"top_k": True}):
        with pytest.raises(ValueError, match="positive int"):
            DynamicTree(**bad)
    with pytest.raises(ValueError, match="can grow at most 4 nodes"):
        DynamicTree(num_nodes=5, depth=1, top_k=4)
    with pytest.raises(ValueError, match="medusa=True"):
        model.generate(ids, tree=DynamicTree(), max_new_tokens=4)
    with pytest.raises(ValueError, match="'dynamic'"):
        model.generate(ids, medusa=True, tree="dynamc", max_new_tokens=4)
    assert DynamicTree(num_nodes=np.int64(8), depth=np.int32(3)) == DynamicTree(8, 3)


def test_the_dynamic_preset_name() -> None:
    model = _recurrent(share_lm_head=False)
    ids, mask = ragged_batch(2, seed=5)
    assert torch.equal(_generate(model, ids, mask, medusa=True, tree="dynamic"), _generate(model.base, ids, mask))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), batch=st.integers(1, 3), size=st.integers(1, 12), slack=st.integers(0, 3))
def test_trees_built_within_known_bounds_equal_trees_built_by_reading(data, batch: int, size: int, slack: int) -> None:
    """The structure computed from a bound on the depth (matrix products, no read) is the one found by walking
    up level by level and reading how far to go, padding nodes included, for any bound at least the depth."""
    rows, masks = [], []
    for _ in range(batch):
        parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, size)]
        real = [True] + [data.draw(st.booleans()) for _ in range(1, size)]
        for i in range(1, size):  # padding hangs from the root and has no children
            if not real[parents[i]]:
                real[i] = False
            if not real[i]:
                parents[i] = 0
        rows.append(parents)
        masks.append(real)
    parents, real = torch.tensor(rows), torch.tensor(masks)
    read = RowTrees.from_parents(parents, real)
    bound = read.depth + slack
    within = RowTrees.from_parents(parents, real, validate=False, max_depth=bound, max_children=size)
    assert torch.equal(within.ancestors, read.ancestors) and torch.equal(within.depths, read.depths)
    assert torch.equal(within.paths[..., : read.depth + 1], read.paths)
    assert bool((within.paths[..., read.depth + 1 :] == -1).all())
