"""Prompt lookup inside a Medusa tree (`generate(medusa=True, prompt_lookup_num_tokens=k)`): grafting by hand,
padding, greedy identity with both kinds of heads and both kinds of trees, errors."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.generation.acceptance import greedy_accept_tree
from hf_specdec.trees.lookup_graft import graft_chains
from hf_specdec.trees.row_trees import RowTrees
from hf_specdec.trees.static import DraftTree
from tests.test_medusa import _generate
from tests.test_recurrent_heads import _recurrent
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model


def test_graft_by_hand() -> None:
    tree = DraftTree([[0], [1], [0, 0]])  # nodes: root, (0), (1), (0,0)
    trees = tree.row_trees().expand(3)
    nodes = torch.tensor([[9, 4, 5, 6], [9, 4, 5, 6], [9, 4, 5, 6]])
    chains = torch.tensor([[4, 7, 8], [5, 0, 0], [1, 2, 3]])
    lengths = torch.tensor([3, 1, 0])
    grafted, out = graft_chains(nodes, trees, chains, lengths)
    # Three slots, one per chain position. Row 0 shares node 1 (token 4: slot 4 is padding), then branches off: 7
    # under node 1 beside node 3 (slot 5), and 8 under 7 (slot 6).
    assert grafted[0].tolist() == [9, 4, 5, 6, 4, 7, 8]
    assert out.parents[0].tolist() == [-1, 0, 0, 1, 0, 1, 5]
    assert out.children[0, 1].tolist()[:2] == [3, 5]  # the heads' own child is tried first
    assert out.real[0].tolist() == [True] * 4 + [False, True, True]
    # Row 1's whole chain is already in the tree; row 2 looks nothing up: their slots are padding.
    assert out.parents[1].tolist() == [-1, 0, 0, 1, 0, 0, 0] and out.real[1].tolist() == [True] * 4 + [False] * 3
    assert out.parents[2].tolist() == [-1, 0, 0, 1, 0, 0, 0] and out.real[2].tolist() == [True] * 4 + [False] * 3
    assert out.children[1, 0].tolist()[:2] == [1, 2] and (out.children[1, 0, 2:] == -1).all()
    # Padding is never accepted, even where its token is what the target wants.
    predicted = torch.tensor([[4, 7, 0, 0, 0, 8, 0], [9, 0, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0]])
    node, num_accepted, _ = greedy_accept_tree(grafted, torch.nn.functional.one_hot(predicted, 10).float(), out)
    assert node.tolist() == [6, 0, 0] and num_accepted.tolist() == [3, 0, 0]


def test_nothing_to_graft_keeps_the_tree() -> None:
    trees = DraftTree([[0], [1]]).row_trees().expand(2)
    nodes = torch.tensor([[1, 2, 3], [1, 2, 3]])
    same, out = graft_chains(nodes, trees, torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    assert same is nodes and out is trees


def _model(arch: str, head_type: str) -> MedusaForCausalLM:
    if head_type == "recurrent":
        return _recurrent(arch, share_lm_head=arch != "gpt2")
    base = tiny_model(arch, seed=0, sharpen=4.0)
    return MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, share_lm_head=arch != "gpt2"))


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("head_type", ["medusa", "recurrent"])
def test_lookup_in_the_tree_keeps_plain_greedy(arch: str, batch: int, head_type: str) -> None:
    model = _model(arch, head_type)
    ids, mask = ragged_batch(batch, seed=batch)
    plain = _generate(model.base, ids, mask)
    for tree in ("small", DynamicTree(num_nodes=6, top_k=3)):
        out = _generate(
            model,
            ids,
            mask,
            medusa=True,
            tree=tree,
            prompt_lookup_num_tokens=5,
            num_assistant_tokens_schedule="constant",
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, plain)
        # Greedy tiny random models fall into loops, which lookup finds.
        assert out.speculative.lookup_steps > 0


@pytest.mark.parametrize(
    "processing", [{"repetition_penalty": 1.5}, {"min_new_tokens": 12, "eos_token_id": 5}, {"no_repeat_ngram_size": 2}]
)
def test_lookup_in_the_tree_with_prefix_reading_processors(processing: dict) -> None:
    model = _recurrent("llama", share_lm_head=False)
    ids, mask = ragged_batch(3, seed=2)
    plain = _generate(model.base, ids, mask, **processing)
    out = _generate(model, ids, mask, medusa=True, tree="small", prompt_lookup_num_tokens=4, **processing)
    assert torch.equal(out, plain)


def test_lookup_raises_tau_where_the_output_repeats() -> None:
    """Greedy tiny random models fall into loops: lookup drafts them where fresh heads cannot."""
    model = _model("llama", "medusa")
    ids, mask = ragged_batch(1, seed=3)
    plain = _generate(model.base, ids, mask)
    kwargs = {"medusa": True, "tree": "chain", "return_dict_in_generate": True}
    without = _generate(model, ids, mask, speculative_costs=SpeculativeCosts(0.0, 0.0), **kwargs)
    out = _generate(model, ids, mask, prompt_lookup_num_tokens=8, num_assistant_tokens_schedule="constant", **kwargs)
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["tau"] > without.speculative.summary()["tau"]


def test_rows_that_stop_early_leave_the_batch() -> None:
    """Row 1 meets EOS (id 82) long before the others: it retires while the others go on with their own trees."""
    model = _recurrent("llama", share_lm_head=False)
    ids, mask = ragged_batch(3, seed=2)
    plain = _generate(model.base, ids, mask, eos_token_id=82)
    assert bool((plain[:, ids.shape[1] :] == 82).any())
    for tree in ("small", DynamicTree(num_nodes=6, top_k=3)):
        for lookup in ({}, {"prompt_lookup_num_tokens": 4}):
            out = _generate(model, ids, mask, medusa=True, tree=tree, eos_token_id=82, **lookup)
            assert torch.equal(out, plain)


def test_padding_stays_padding_when_a_chain_is_grafted() -> None:
    """Node 2 is padding (never tried): a chain through its token gets a real node of its own, and node 2 stays
    padding; a slot a row's chain does not need is padding too."""
    trees = RowTrees.from_parents(
        torch.tensor([[-1, 0, 0], [-1, 0, 0]]), torch.tensor([[True, True, False], [True, True, True]])
    )
    nodes = torch.tensor([[1, 2, 3], [1, 2, 3]])
    grafted, out = graft_chains(nodes, trees, torch.tensor([[3, 5], [2, 6]]), torch.tensor([2, 2]))
    assert grafted[0, :5].tolist() == [1, 2, 3, 3, 5] and out.parents[0].tolist() == [-1, 0, 0, 0, 3]
    assert out.real[0].tolist() == [True, True, False, True, True]
    assert out.parents[1].tolist() == [-1, 0, 0, 0, 1] and out.real[1].tolist() == [True, True, True, False, True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_matching_ngram_size": 2}, "prompt_lookup_num_tokens"),
        ({"num_assistant_tokens_schedule": "heuristic"}, "adaptive"),
        ({"prompt_lookup_num_tokens": 0}, "positive integer"),
        ({"prompt_lookup_num_tokens": 4, "num_assistant_tokens_schedule": "heuristic"}, "adaptive"),
    ],
)
def test_lookup_settings_errors(kwargs: dict, message: str) -> None:
    model = _model("llama", "medusa")
    with pytest.raises(ValueError, match=message):
        model.generate(torch.tensor([[1, 2, 3]]), medusa=True, max_new_tokens=4, **kwargs)
