"""Tree buffers on a hand-drawn tree, and the tree forward against running each path alone."""

from __future__ import annotations

import pytest
import torch

from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.trees.masks import chain_structure
from hf_specdec.trees.static import DraftTree
from tests.tiny_models import BUILDERS, tiny_model

#          root(0)
#         /       \
#    [0](1)       [1](2)
#    /    \          |
# [0,0](3) [0,1](4) [1,0](5)
CHOICES = [[1, 0], [0], [0, 1], [1], [0, 0]]  # any order


def test_buffers_of_a_hand_drawn_tree() -> None:
    tree = DraftTree(CHOICES)
    assert tree.choices == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.ranks.tolist() == [0, 0, 1, 0, 1, 0]
    assert tree.paths.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestors, expected)
    assert tree.num_nodes == 6 and tree.depth == 2
    assert tree.top_k_per_depth() == [2, 2]


def test_paths_of_different_lengths_are_padded() -> None:
    tree = DraftTree([[0], [1], [0, 0]])
    assert tree.paths.tolist() == [[0, 2, -1], [0, 1, 3]]  # leaves in node order


def test_a_chain_is_a_tree_with_one_child_per_node() -> None:
    chain = DraftTree.chain(3)
    assert torch.equal(chain.ancestors, chain_structure(4, torch.device("cpu")))
    assert chain.paths.tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([], "at least one path"),
        ([[0], [0, 1, 0]], "no parent"),
        ([[0], [0]], "more than once"),
        ([[0], [-1]], "ranks >= 0"),
        ([[0], []], "non-empty"),
    ],
)
def test_invalid_trees(choices, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraftTree(choices)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_tree_forward_equals_each_path_alone(arch: str) -> None:
    """One forward over the whole tree gives, at every node, the logits of running its path alone;
    keeping one path's slots leaves the cache as if only that path had been fed."""
    model = tiny_model(arch, seed=0)
    tree = DraftTree(CHOICES)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    nodes = torch.tensor([[11, 20, 21, 30, 31, 40]])  # a token per node, the root first
    seq = CachedSequence(model, 1, torch.device("cpu"))
    valid = torch.ones_like(prompt, dtype=torch.bool)
    seq.forward(prompt, valid, torch.arange(6)[None], chain_structure(6, torch.device("cpu")))
    tree_logits = seq.forward(
        nodes, torch.ones_like(nodes, dtype=torch.bool), 6 + tree.depths[None], tree.ancestors
    ).logits[0]
    for path in tree.paths.tolist():
        path = [n for n in path if n >= 0]
        alone = model(torch.cat([prompt, nodes[:, path]], dim=1)).logits[0, 6:]
        torch.testing.assert_close(tree_logits[path], alone, rtol=1e-4, atol=1e-4)
    # Keep path [0, 2, 5] and decode one more token: same as feeding that path alone.
    keep = torch.tensor([[0, 2, 5]])
    seq.keep_path(tree.num_nodes, keep, torch.tensor([3]))
    nxt = torch.tensor([[50]])
    after = seq.forward(nxt, torch.ones_like(nxt, dtype=torch.bool), torch.tensor([[9]]), chain_structure(1, "cpu"))
    alone = model(torch.cat([prompt, nodes[:, [0, 2, 5]], nxt], dim=1)).logits[0, -1]
    torch.testing.assert_close(after.logits[0, -1], alone, rtol=1e-4, atol=1e-4)
