"""Each call starts from what the last call of the same models measured (`decisions.memory`), and a draft model's
acceptance, measured on the least advanced row, decides whether it is worth starting (`CostModel.acceptance`)."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
import torch

import hf_specdec
from hf_specdec import SpeculativeCosts
from hf_specdec.generation.decisions import CostModel, chain_rate, forget_measured_costs, remembered_costs
from hf_specdec.generation.decisions.constants import PRIOR_DRAFT_ACCEPTANCE
from tests.tiny_models import ragged_batch, tiny_model


def _models(twin: bool = True) -> tuple[torch.nn.Module, torch.nn.Module]:
    target = hf_specdec.speculative(tiny_model("llama", seed=0, sharpen=4.0))
    return target, tiny_model("llama", seed=0 if twin else 5, sharpen=4.0)


def _call(target, draft, rows: int = 3, **kwargs) -> torch.Tensor:
    ids, mask = ragged_batch(rows, seed=2)
    return target.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, assistant=draft, **kwargs
    )


def _recalled(target, draft) -> CostModel:
    return remembered_costs(target, draft, CostModel(0.3), "chain")


def test_a_call_leaves_what_it_measured_to_the_next_call_of_the_same_models() -> None:
    target, draft = _models()
    assert not _recalled(target, draft).knows_plain(3)
    _call(target, draft, rows=3)
    recalled = _recalled(target, draft)
    # Every call measures its batch's plain step and its prefill: the next call needs neither measured again.
    assert recalled.knows_plain(3) and recalled.token_seconds is not None and recalled.plain_seconds(3) > 0
    assert not recalled.knows_plain(2)  # by rows: a batch of another size still measures its own
    # Another draft model, or prompt lookup alone, starts cold.
    other = tiny_model("llama", seed=7)
    assert not _recalled(target, other).knows_plain(3)
    assert not remembered_costs(target, "prompt lookup", CostModel.verification_only()).knows_plain(3)
    forget_measured_costs()
    assert not _recalled(target, draft).knows_plain(3)


def test_fixed_costs_neither_read_nor_write_what_calls_measured() -> None:
    target, draft = _models()
    _call(target, draft, speculative_costs=SpeculativeCosts(0.1, 0.01))
    assert not _recalled(target, draft).knows_plain(3)
    _call(target, draft)  # measured: kept, but a call with fixed costs decides from those alone
    fixed = remembered_costs(target, draft, CostModel(0.3, SpeculativeCosts(0.1, 0.01)))
    assert fixed.estimated == SpeculativeCosts(0.1, 0.01) and fixed.keeper is None and fixed.token_seconds is None


def test_the_memory_does_not_keep_models_alive() -> None:
    target, draft = _models()
    _call(target, draft)
    dead_target, dead_draft = weakref.ref(target), weakref.ref(draft)
    del target, draft
    gc.collect()
    assert dead_target() is None and dead_draft() is None


def test_a_draft_models_acceptance_is_measured_on_the_least_advanced_row_and_kept() -> None:
    """A twin draft drafting at every step (constant schedule): every draft is accepted, and the next call of the
    pair weighs starting the draft with that acceptance instead of the prior."""
    target, draft = _models(twin=True)
    _call(target, draft, num_assistant_tokens_schedule="constant", num_assistant_tokens=3)
    assert _recalled(target, draft).acceptance(3) > 0.9 > PRIOR_DRAFT_ACCEPTANCE
    assert _recalled(target, draft).acceptance(1) == pytest.approx(PRIOR_DRAFT_ACCEPTANCE)  # by rows


def test_acceptance_moves_from_the_prior_to_what_chains_show_and_prices_the_chains() -> None:
    costs = CostModel(draft_forward=0.2)
    costs.observe_plain(0.1, 4)
    costs.observe(0.0, 0, verify_seconds=0.1, rows=4, verified_per_row=1)
    costs.observe(0.0, 0, verify_seconds=0.11, rows=4, verified_per_row=3)
    assert costs.acceptance(4) == pytest.approx(PRIOR_DRAFT_ACCEPTANCE)
    hopeful = chain_rate(costs, 4, 16)
    for _ in range(60):  # the least advanced row rejects the first of four drafts
        costs.observe_acceptance(4, 0, 4)
    assert costs.acceptance(4) < 0.1
    measured = chain_rate(costs, 4, 16)
    assert hopeful is not None and measured is not None and measured < 1.0 < hopeful
    for _ in range(100):  # then every draft is accepted: older counts fade
        costs.observe_acceptance(4, 4, 4)
    assert costs.acceptance(4) > 0.9
    assert costs.acceptance(8) == pytest.approx(PRIOR_DRAFT_ACCEPTANCE)


def test_a_draft_forward_is_timed_once_before_the_draft_is_started() -> None:
    """Before a draft model is judged worth its prefill, one draft forward is timed (twice: the second counts) so
    that `c` is measured rather than taken from its parameter share; the next call of the pair knows it."""
    target, draft = _models(twin=False)
    probes: list[object] = []
    draft.register_forward_hook(lambda m, a, kwargs, out: probes.append(kwargs.get("use_cache")), with_kwargs=True)
    assert not _recalled(target, draft).draft_measured
    _call(target, draft)
    assert probes.count(False) == 2 and _recalled(target, draft).draft_measured
    probes.clear()
    _call(target, draft)
    assert False not in probes
    _call(target, draft, rows=2, speculative_costs=SpeculativeCosts(5.0, 5.0))  # fixed: nothing to measure
    assert False not in probes


def test_a_draft_models_chains_and_its_trees_keep_their_own_costs() -> None:
    """A tree's draft forward (a depth over several nodes per row) is not a chain's: each keeps its own."""
    target, draft = _models()
    _call(target, draft, tree=hf_specdec.DynamicTree(num_nodes=6, depth=3, top_k=2))
    assert remembered_costs(target, draft, CostModel(0.3), "tree").knows_plain(3)
    assert not _recalled(target, draft).knows_plain(3)


def test_the_step_that_times_the_draft_forward_is_no_measure_of_a_plain_step(monkeypatch) -> None:
    """The timed draft forward is a one-off in its step: that step is left out of the plain steps' time (here the
    probe takes a second, far more than any step of these tiny models)."""
    from hf_specdec.drafters.draft_model import DraftModelDrafter

    def slow_probe(self, rows: int) -> float:
        time.sleep(1.0)
        return 1.0

    plain_steps: list[float] = []
    observe_plain = CostModel.observe_plain
    monkeypatch.setattr(DraftModelDrafter, "_probe", slow_probe)
    monkeypatch.setattr(
        CostModel, "observe_plain", lambda self, s, rows: (plain_steps.append(s), observe_plain(self, s, rows))
    )
    for extra in ({}, {"prompt_lookup_num_tokens": 3}, {"tree": hf_specdec.DynamicTree(num_nodes=6, depth=3, top_k=2)}):
        forget_measured_costs()
        plain_steps.clear()
        target, draft = _models(twin=False)
        _call(target, draft, **extra)
        assert plain_steps and max(plain_steps) < 1.0, extra
