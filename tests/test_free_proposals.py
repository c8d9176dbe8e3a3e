"""Prompt lookup proposes on the steps the speculation gate keeps plain, beside a draft model's trees and Medusa,
recurrent or EAGLE-3 heads (`FreeProposals`): outputs stay plain greedy's, such steps are lookup steps, not plain
ones, and the drafter follows the text they commit (a draft twin agrees with the target again at its next tree;
EAGLE heads queue the committed path's features)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.drafters.draft_tree import DraftTreeDrafter
from hf_specdec.generation.decisions.gate import SpeculationGate
from hf_specdec.generation.drafter import Accepted, FreeProposals, append_pending
from hf_specdec.medusa.drafter import MedusaDrafter
from hf_specdec.medusa.eagle_drafter import EagleDrafter
from tests.test_recurrent_heads import _recurrent
from tests.tiny_models import ragged_batch, tiny_model, tiny_target

NEW = 48
COSTS = SpeculativeCosts(draft_forward=0.1, verify_per_token=0.01)
# Drafting never pays at these costs (a draft forward at five target forwards), so the gate keeps steps plain.
GATED = SpeculativeCosts(draft_forward=5.0, verify_per_token=0.01)
PATHS = ["draft tree", "medusa static", "medusa dynamic", "recurrent", "eagle3"]


@pytest.fixture
def waiting_gate(monkeypatch):
    """The gate keeps two steps of every three plain (none of them to measure a plain step), whatever drafting
    brings: free proposals run on known steps, and the drafter grows trees between them."""
    steps = itertools.count()

    def speculate(self, rows: int) -> bool:
        self.measuring = False
        return next(steps) % 3 == 2

    monkeypatch.setattr(SpeculationGate, "speculate", speculate)


def _heads(head_type: str) -> MedusaForCausalLM:
    if head_type == "recurrent":
        return _recurrent("llama")
    base = tiny_model("llama", seed=0, sharpen=4.0)
    return MedusaForCausalLM.from_base(base, MedusaConfig(head_type=head_type, num_heads=3))


def _path(name: str, draft: Any = None) -> tuple[Any, Any, type, dict[str, Any]]:
    """(the model generate() is called on, the model plain greedy runs on, the drafter class, the arguments)."""
    if name == "draft tree":
        target = tiny_target("llama")
        draft = tiny_model("llama", seed=3, num_layers=1) if draft is None else draft
        return target, target, DraftTreeDrafter, {"assistant": draft, "tree": 8}
    head_type, tree = {
        "medusa static": ("medusa", "small"),
        "medusa dynamic": ("medusa", DynamicTree(num_nodes=6, top_k=3)),
        "recurrent": ("recurrent", DynamicTree(num_nodes=6, top_k=3)),
        "eagle3": ("eagle3", 8),
    }[name]
    model = _heads(head_type)
    drafter = EagleDrafter if head_type == "eagle3" else MedusaDrafter
    return model, model.base, drafter, {"medusa": True, "tree": tree}


def _counting(drafter_class: type, monkeypatch) -> list[int]:
    """Count the tokens each free proposal drafts (0 where it proposes nothing)."""
    free: list[int] = []
    propose_free = drafter_class.propose_free

    def counting(self, *args, **kw):
        proposal = propose_free(self, *args, **kw)
        free.append(0 if proposal is None else int(proposal.nodes.shape[1] - 1))
        return proposal

    monkeypatch.setattr(drafter_class, "propose_free", counting)
    return free


def _generate(model, ids, mask, **kwargs):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **kwargs)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", PATHS)
def test_the_lookup_proposes_while_the_gate_keeps_a_tree_drafter_waiting(
    name: str, batch: int, waiting_gate, monkeypatch
) -> None:
    model, base, drafter_class, kwargs = _path(name)
    assert issubclass(drafter_class, FreeProposals)
    free = _counting(drafter_class, monkeypatch)
    ids, mask = ragged_batch(batch, seed=4)
    plain = _generate(base, ids, mask)
    out = _generate(
        model, ids, mask, prompt_lookup_num_tokens=4, speculative_costs=COSTS, return_dict_in_generate=True, **kwargs
    )
    assert torch.equal(out.sequences, plain)
    stats = out.speculative
    assert free and max(free) > 0 and min(free) == 0  # during the waits, the lookup drafted, or nothing did
    assert stats.plain_steps == free.count(0)  # the steps it drafted in are not plain ones
    assert stats.lookup_steps >= len(free) - free.count(0)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_lookup_drafts_in_place_of_a_draft_tree_that_does_not_pay(batch: int) -> None:
    """The draft model is never started (its trees cannot pay), and the lookup drafts on its own."""
    target, _, _, kwargs = _path("draft tree")
    ids, mask = ragged_batch(batch, seed=4)
    plain = _generate(target, ids, mask)
    out = _generate(
        target, ids, mask, prompt_lookup_num_tokens=4, speculative_costs=GATED, return_dict_in_generate=True,
        **kwargs,
    )  # fmt: skip
    assert torch.equal(out.sequences, plain)
    assert out.speculative.draft_forwards == 0 and out.speculative.lookup_steps > 0


def test_without_a_lookup_a_tree_drafter_proposes_nothing_while_the_gate_waits(waiting_gate, monkeypatch) -> None:
    free = _counting(DraftTreeDrafter, monkeypatch)
    target, _, _, kwargs = _path("draft tree")
    ids, mask = ragged_batch(2, seed=4)
    out = _generate(target, ids, mask, speculative_costs=COSTS, return_dict_in_generate=True, **kwargs)
    assert free and max(free) == 0
    assert out.speculative.lookup_steps == 0 and out.speculative.plain_steps == len(free)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_draft_twin_catches_up_on_what_lookup_steps_committed(batch: int, waiting_gate, monkeypatch) -> None:
    """The target's own copy drafts: after lookup steps taken while the gate waited, its next tree starts from
    the committed text, so every row's first drafted token is the target's (accepted) when it drafts again."""
    target, _, _, kwargs = _path("draft tree", draft=copy.deepcopy(tiny_target("llama")))
    free = _counting(DraftTreeDrafter, monkeypatch)
    after_free: list[list[int]] = []
    commit = DraftTreeDrafter.commit

    def recording(self, accepted: Accepted) -> None:
        if self._fed_pool is not None and any(free):  # a grown tree after a lookup step
            after_free.append(accepted.num_accepted.tolist())
        commit(self, accepted)

    monkeypatch.setattr(DraftTreeDrafter, "commit", recording)
    ids, mask = ragged_batch(batch, seed=4)
    plain = _generate(target, ids, mask)
    out = _generate(target, ids, mask, prompt_lookup_num_tokens=4, speculative_costs=COSTS, **kwargs)
    assert torch.equal(out, plain)
    assert len(after_free) >= 3, "too few trees grown after lookup steps"
    assert all(min(step) >= 1 for step in after_free), after_free


def test_a_path_joins_the_pending_entries_after_each_rows_own() -> None:
    features = torch.arange(2 * 3 * 2, dtype=torch.float).reshape(2, 3, 2)
    tokens = torch.tensor([[1, 2, 0], [3, 0, 0]])
    count = torch.tensor([2, 1])
    hidden = 100 + torch.arange(2 * 3 * 2, dtype=torch.float).reshape(2, 3, 2)
    path_tokens = torch.tensor([[7, 8, 9], [5, 6, 4]])
    accepted = Accepted(
        path=torch.tensor([[0, 1, -1], [0, 1, 2]]),
        num_accepted=torch.tensor([1, 2]),
        next_token=torch.tensor([8, 4]),
        tokens=path_tokens,
        emitted=torch.tensor([2, 3]),
        hidden=hidden,
    )
    new_features, new_tokens, new_count = append_pending(features, tokens, count, accepted, most=3)
    assert new_count.tolist() == [4, 4]
    assert new_features.shape == (2, 6, 2) and new_tokens.shape == (2, 6)
    assert new_tokens[0, :4].tolist() == [1, 2, 7, 8] and new_tokens[1, :4].tolist() == [3, 5, 6, 4]
    assert torch.equal(new_features[0, :2], features[0, :2]) and torch.equal(new_features[0, 2:4], hidden[0, :2])
    assert torch.equal(new_features[1, :1], features[1, :1]) and torch.equal(new_features[1, 1:4], hidden[1])
    # A plain step: the root alone.
    plain = accepted._replace(num_accepted=torch.tensor([0, 0]), hidden=hidden[:, :1], tokens=path_tokens[:, :1])
    one_features, one_tokens, one_count = append_pending(features, tokens, count, plain)
    assert one_count.tolist() == [3, 2] and one_tokens.tolist() == [[1, 2, 7, 0], [3, 5, 0, 0]]
    assert torch.equal(one_features[0, 2], hidden[0, 0]) and torch.equal(one_features[1, 1], hidden[1, 0])
