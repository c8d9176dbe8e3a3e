"""A draft model is started only where its prefill and its steps are expected to pay (`draft_model_pays`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hf_specdec
from hf_specdec import DynamicTree, SpeculativeCosts
from hf_specdec.generation.decisions import CostModel, chain_rate, draft_model_pays
from tests.tiny_models import ragged_batch, tiny_model

# At batch 4 each verified draft costs a plain step in every row: no chain can pay.
WIDE_AND_DEAR = SpeculativeCosts(draft_forward=0.2, verify_per_token=0.5)
CHEAP = SpeculativeCosts(draft_forward=0.1, verify_per_token=0.01)

PATHS: dict[str, dict[str, Any]] = {
    "assistant": {},
    "assistant-tree": {"tree": DynamicTree(num_nodes=6, depth=3, top_k=2)},
    "hybrid": {"prompt_lookup_num_tokens": 4},
}


def _run(path: str, costs: SpeculativeCosts, twin: bool = False) -> tuple[Any, torch.Tensor, int]:
    """Speculative and plain greedy outputs of 4 ragged rows, and the forwards the draft model ran (`twin`: the
    draft is the target's twin, whose every draft is accepted)."""
    target = hf_specdec.speculative(tiny_model("llama", seed=0, sharpen=4.0))
    draft = tiny_model("llama", seed=0 if twin else 5, sharpen=4.0)
    forwards = []
    draft.register_forward_hook(lambda *_: forwards.append(1))
    ids, mask = ragged_batch(4, seed=2)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 24, "do_sample": False}
    plain = target.generate(**kwargs)
    out = target.generate(
        assistant=draft, speculative_costs=costs, return_dict_in_generate=True, **PATHS[path], **kwargs
    )
    return out, plain, len(forwards)


@pytest.mark.parametrize("path", list(PATHS))
def test_a_draft_model_whose_steps_cannot_pay_is_never_started(path: str) -> None:
    """Wide verification dearer than what any chain brings: from the first step every step is plain (or prompt
    lookup's), and the draft model never runs, not even over the prompts."""
    out, plain, forwards = _run(path, WIDE_AND_DEAR)
    assert torch.equal(out.sequences, plain)
    assert forwards == 0 and out.speculative.draft_forwards == 0
    if path != "hybrid":  # (prompt lookup may draft where the text repeats itself)
        assert out.speculative.verify_widths == {1: out.speculative.plain_steps}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_draft_model_that_pays_drafts_from_the_first_step(path: str) -> None:
    out, plain, forwards = _run(path, CHEAP, twin=True)
    assert torch.equal(out.sequences, plain)
    assert forwards > 0 and out.speculative.plain_steps == 0


def _measured(rows: int, plain_seconds: float, token_seconds: float, share: float = 0.3) -> CostModel:
    costs = CostModel(draft_forward=share)
    costs.observe_prefill(token_seconds * 1000, 1000)
    costs.observe_plain(plain_seconds, rows)
    return costs


def test_before_a_plain_step_is_measured_nothing_is_decided() -> None:
    costs = CostModel(draft_forward=0.3)
    costs.observe_prefill(1.0, 100)
    assert chain_rate(costs, 1, 8) is None and draft_model_pays(costs, 1, 64, 100) is None


def test_wide_verification_is_priced_from_the_prefill_until_a_step_measures_it() -> None:
    """Before a step verifies drafts, one more verified token costs what the prefill spent per token, over a plain
    step. One row on a machine whose plain step is 10 tokens' compute: a draft costs 0.3 + 0.1 plain steps, and a
    chain of them (each accepted with chance 0.8) brings at best about 1.36 tokens per plain step; in 8 rows each
    draft costs 0.3 + 0.8, and no chain pays."""
    one = _measured(rows=1, plain_seconds=0.1, token_seconds=0.01)
    best = max(sum(0.8**i for i in range(k + 1)) / (1 + 0.4 * k) for k in range(1, 17))
    assert chain_rate(one, 1, 16) == pytest.approx(best) and best == pytest.approx(1.3556, abs=1e-4)
    eight = _measured(rows=8, plain_seconds=0.1, token_seconds=0.01)
    rate = chain_rate(eight, 8, 16)
    assert rate is not None and rate < 1.0 and draft_model_pays(eight, 8, 64, 10) is False
    # A measured step replaces the prior: verifying 2 tokens per row of 8 rows took barely more than a plain step.
    eight.observe(0.0, 0, verify_seconds=0.09, rows=8, verified_per_row=1)
    eight.observe(0.0, 0, verify_seconds=0.1, rows=8, verified_per_row=2)
    rate = chain_rate(eight, 8, 16)
    assert rate is not None and rate > 1.0


def test_the_draft_starts_only_if_the_tokens_left_repay_its_prefill() -> None:
    """One row, rate about 1.36: 64 tokens left save about 17 plain steps, which do not repay a prefill of 1,000
    prompt tokens (0.3 x 1000 x 0.01 s = 3 s = 30 plain steps), and 200 tokens left do; 100 tokens' (3 steps)
    pays with 64 left, not with 4."""
    costs = _measured(rows=1, plain_seconds=0.1, token_seconds=0.01)
    assert draft_model_pays(costs, 1, 64, 100) is True
    assert draft_model_pays(costs, 1, 4, 100) is False
    assert draft_model_pays(costs, 1, 64, 1000) is False
    assert draft_model_pays(costs, 1, 200, 1000) is True
    # Fixed costs weigh the steps alone (no seconds to price a prefill with).
    fixed = CostModel(draft_forward=0.3, fixed=CHEAP)
    assert draft_model_pays(fixed, 1, 2, 10**6) is True
    assert draft_model_pays(CostModel(fixed=WIDE_AND_DEAR), 4, 64, 0) is False
