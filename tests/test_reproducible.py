"""Reproducible sampling: with fixed `speculative_costs` and a seeded generator, a sampled output does not
depend on how long anything took (measured costs make draft lengths and the hybrid's choice follow the clock)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
import torch

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.generation.decisions import CostModel, SpeculationGate
from tests.tiny_models import ragged_batch, tiny_model

COSTS = SpeculativeCosts(draft_forward=0.05, verify_per_token=0.01)


@contextlib.contextmanager
def _clock(draft_forward_seconds: float) -> Iterator[None]:
    """Patches the loop's cost measurements with a synthetic machine on which a draft forward takes
    `draft_forward_seconds` and verification 1 s plus 1 ms per verified token (real timings vary)."""
    observe, gate_observe = CostModel.observe, SpeculationGate.observe

    def verify(rows: int, width: int) -> float:
        return 1.0 + 1e-3 * rows * width

    def costs(self, draft_seconds, forwards, verify_seconds, rows, verified_per_row) -> None:
        verified = verify(rows, verified_per_row)
        observe(self, forwards * draft_forward_seconds, forwards, verified, rows, verified_per_row)

    def gate(self, tokens, seconds, forwards, rows, verified_per_row, verify_seconds, free=False) -> None:
        verified = verify(rows, verified_per_row)
        gate_observe(
            self, tokens, forwards * draft_forward_seconds + verified, forwards, rows, verified_per_row, verified, free
        )

    with (
        mock.patch.object(CostModel, "observe", costs),
        mock.patch.object(SpeculationGate, "observe", gate),
    ):
        yield


def _run(
    path: str, clock: contextlib.AbstractContextManager, costs: SpeculativeCosts | None
) -> hf_specdec.SpeculativeDecoderOnlyOutput:
    target = hf_specdec.speculative(tiny_model("llama", seed=0, sharpen=6.0))
    ids, mask = ragged_batch(2, seed=1)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 60, "do_sample": True}
    kwargs |= {"generator": torch.Generator().manual_seed(7), "return_dict_in_generate": True}
    if costs is not None:
        kwargs["speculative_costs"] = costs
    if path in ("lookup", "hybrid", "medusa-lookup"):
        kwargs["prompt_lookup_num_tokens"] = 5
    with clock:
        if path.startswith("medusa"):
            torch.manual_seed(3)
            model = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=3))
            return model.generate(medusa=True, tree=DynamicTree(num_nodes=6), **kwargs)
        if path in ("assistant", "hybrid", "assistant-tree"):
            kwargs["assistant"] = tiny_model("llama", seed=0, sharpen=6.0)  # the target's twin: it drafts far
        if path == "assistant-tree":
            kwargs["tree"] = DynamicTree(num_nodes=6, depth=4, top_k=2)
        return target.generate(**kwargs)


@pytest.mark.parametrize("path", ["assistant", "assistant-tree", "lookup", "hybrid", "medusa", "medusa-lookup"])
def test_fixed_costs_make_seeded_sampling_independent_of_timings(path: str) -> None:
    first, second = _run(path, _clock(1e-3), COSTS), _run(path, _clock(10.0), COSTS)
    assert torch.equal(first.sequences, second.sequences)
    assert torch.equal(first.speculative.drafted_tokens, second.speculative.drafted_tokens)
    expected = (
        COSTS if path in ("assistant", "hybrid", "assistant-tree") else SpeculativeCosts(0.0, COSTS.verify_per_token)
    )
    assert first.speculative.costs == second.speculative.costs == expected


def test_measured_costs_follow_the_clock() -> None:
    """Without fixed costs the same seeded call drafts differently when drafting seems slow: what the setting
    is for. (The draft, the target's twin, is first guessed at a twentieth of the target's cost, so that it is
    started: at its own size no chain could pay, and it would never run.)"""
    with mock.patch("hf_specdec.drafters.decoding.parameter_share", return_value=0.05):
        first, second = _run("assistant", _clock(1e-3), None), _run("assistant", _clock(10.0), None)
    assert not torch.equal(first.speculative.drafted_tokens, second.speculative.drafted_tokens)
    assert first.speculative.costs.draft_forward < second.speculative.costs.draft_forward


def test_costs_are_checked() -> None:
    with pytest.raises(ValueError, match="verify_per_token"):
        SpeculativeCosts(draft_forward=0.1, verify_per_token=-1.0)
    target = hf_specdec.speculative(tiny_model("llama", seed=0))
    ids, _ = ragged_batch(1)
    with pytest.raises(TypeError, match="speculative_costs"):
        target.generate(ids, prompt_lookup_num_tokens=3, speculative_costs=0.1)
    model = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2))
    with pytest.raises(TypeError, match="speculative_costs"):
        model.generate(ids, medusa=True, speculative_costs=(0.1, 0.1))
