"""The cost model and the speculation gate: costs recovered from timings, plain steps where drafting does not
pay, and every path still plain greedy's tokens when the gate takes plain steps."""

from __future__ import annotations

import pytest
import torch

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.generation.decisions import CostModel, SpeculationGate
from tests.tiny_models import ragged_batch, tiny_model


def test_costs_are_recovered_from_step_timings() -> None:
    """Target: 0.2 s for one token per row at batch 4, +0.01 s per extra verified token; draft: 0.08 s."""
    costs = CostModel(draft_forward=0.3)
    for k in [2, 5, 8, 3, 6, 4, 7] * 4:
        costs.observe(0.08 * k, k, 0.2 + 0.01 * (4 * (k + 1) - 4), rows=4, verified_per_row=k + 1)
    assert costs.draft_forward == pytest.approx(0.4, abs=0.01)
    assert costs.verify_per_token == pytest.approx(0.05, abs=0.005)
    assert costs.estimated == SpeculativeCosts(costs.draft_forward, costs.verify_per_token)


def test_a_steps_fixed_cost_is_told_apart_from_each_more_verified_token() -> None:
    """Target at batch 4: a plain step's forward 0.2 s; verifying k drafts per row 0.25 + 0.005 * 4k s (a CPU's
    forward leaving its one-token path): `s` = 0.05 / 0.2 = 0.25 plain steps and `v` = 0.005 / 0.2 = 0.025, not a
    line through the plain step that would price every token higher."""
    costs = CostModel(draft_forward=0.3)
    for k in [2, 5, 8, 3, 6, 4, 7] * 4:
        costs.observe(0.0, 0, 0.2, rows=4, verified_per_row=1)
        costs.observe(0.06 * k, k, 0.25 + 0.005 * 4 * k, rows=4, verified_per_row=k + 1)
    assert costs.verify_per_token == pytest.approx(0.025, abs=0.002)
    assert costs.step_overhead == pytest.approx(0.25, abs=0.02)
    assert costs.draft_forward == pytest.approx(0.3, abs=0.01)  # 0.06 s against the plain forward's 0.2 s
    assert costs.estimated.step(0, rows=4, verified_per_row=1) == 1.0  # a plain step pays no overhead
    assert costs.estimated.step(0, rows=4, verified_per_row=3) == pytest.approx(1.0 + 0.25 + 0.025 * 8, abs=0.03)


def test_a_lookup_drafts_nothing_when_its_drafts_cannot_pay_for_the_step() -> None:
    """Each position's 0.3 chance passes the per-token cost of 0.1, but two positions bring 0.4 more than their
    cost, short of a step's fixed cost of 0.5: a plain step instead; with 0.3 of fixed cost they draft."""
    shared_width = hf_specdec.generation.decisions.shared_width
    assert shared_width([[0.3, 0.3]], None, cost=0.1, step_cost=0.5) == 0
    assert shared_width([[0.3, 0.3]], None, cost=0.1, step_cost=0.3) == 2
    assert shared_width([[0.3, 0.3]], None, cost=0.1) == 2


def test_fixed_costs_predict_a_step_and_never_change() -> None:
    fixed = SpeculativeCosts(draft_forward=0.3, verify_per_token=0.05)
    assert fixed.step(draft_forwards=4, rows=4, verified_per_row=5) == pytest.approx(1.2 + 1.0 + 0.8)
    assert fixed.step(draft_forwards=0, rows=4, verified_per_row=1) == 1.0  # a plain step
    costs = CostModel(draft_forward=0.9, fixed=fixed)
    costs.observe(5.0, 2, 1.0, rows=1, verified_per_row=3)
    assert costs.estimated == fixed
    assert costs.in_plain_steps(123.0, 4, 4, 5, 9.0) == pytest.approx(3.0)


def test_gate_takes_plain_steps_while_drafting_loses_and_retries_ever_later() -> None:
    gate = SpeculationGate(CostModel(fixed=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.05)))
    assert gate.speculate(4)  # nothing measured yet: draft
    # Four drafts for each of four rows cost 3 plain steps; 1.5 tokens per row do not pay for them.
    gate.observe(1.5, seconds=0.0, draft_forwards=4, rows=4, verified_per_row=5, verify_seconds=0.0)
    assert [gate.speculate(4) for _ in range(3)] == [False, False, True]
    gate.observe(1.5, seconds=0.0, draft_forwards=4, rows=4, verified_per_row=5, verify_seconds=0.0)
    assert [gate.speculate(4) for _ in range(5)] == [False] * 4 + [True]  # patience doubled
    # The text turns easy: one step committing 10 tokens per row lifts the running gain above the cost.
    gate.observe(10.0, seconds=0.0, draft_forwards=4, rows=4, verified_per_row=5, verify_seconds=0.0)
    assert all(gate.speculate(4) for _ in range(10))


def test_gate_compares_measured_seconds_with_a_plain_step() -> None:
    """A plain step of 4 rows takes 0.22 s; a speculative one of 0.46 s is 0.46 / 0.22 = 2.1 plain steps:
    1.5 tokens lose, and so do 2.0 (0.96 tokens per plain step: plain steps would have brought more); 2.2 win.
    Before a plain step of that many rows is measured, the gate measures one: the first step is plain."""
    costs = CostModel(draft_forward=0.0)
    first = SpeculationGate(costs)
    assert not first.speculate(4) and first.measuring  # no plain step of 4 rows measured yet
    first.observe(1.0, 0.22, 0, 4, 1, 0.2)
    assert first.speculate(4) and not first.measuring
    assert costs.in_plain_steps(0.46, 0, 4, 5, 0.36) == pytest.approx(0.46 / 0.22)
    # Each gate keeps its running gain in its own cost model (one per decoding call).
    models = [CostModel(draft_forward=0.0) for _ in range(3)]
    for model in models:
        model.observe_plain(0.22, 4)
    losing, close, winning = (SpeculationGate(model) for model in models)
    losing.observe(1.5, 0.46, 0, 4, 5, 0.36)
    assert not losing.speculate(4)
    close.observe(2.0, 0.46, 0, 4, 5, 0.36)
    assert not close.speculate(4)
    winning.observe(2.2, 0.46, 0, 4, 5, 0.36)
    assert winning.speculate(4)
    assert not winning.speculate(3)  # rows left the batch: a plain step of 3 rows is measured first


def test_a_step_that_drafted_nothing_measures_a_plain_step() -> None:
    costs = CostModel()
    gate = SpeculationGate(costs)
    gate.observe(1.0, seconds=0.3, draft_forwards=0, rows=2, verified_per_row=1, verify_seconds=0.25)
    assert gate.speculate(2) and costs.knows_plain(2) and not costs.knows_plain(1)
    assert costs.in_plain_steps(0.6, 1, 2, 3, 0.4) == pytest.approx(2.0)


def test_fixed_costs_measure_nothing() -> None:
    """With fixed costs the gate never explores (its decisions must not depend on timings)."""
    gate = SpeculationGate(CostModel(fixed=SpeculativeCosts(0.1, 0.01)))
    gate.observe(3.0, seconds=9.0, draft_forwards=2, rows=2, verified_per_row=3, verify_seconds=5.0)
    assert all(gate.speculate(rows) for rows in (1, 2, 3))


def test_one_more_draft_must_beat_the_rate_recent_steps_brought() -> None:
    """The threshold a drafted token's expected gain must reach is its cost times the tokens per plain step that
    recent speculative steps brought (at least 1: what a plain step brings), not the cost alone."""
    costs = CostModel(fixed=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.05))
    assert costs.rate == 1.0 and costs.threshold(2, draft_forwards=1) == pytest.approx(
        0.4
    )  # before any step: break-even
    costs.observe_step(gained=5.0, cost=2.5)
    assert costs.rate == pytest.approx(2.0)
    assert costs.threshold(2, draft_forwards=1) == pytest.approx(0.8) and costs.threshold(2) == pytest.approx(0.2)
    costs.observe_step(gained=1.0, cost=2.0)  # running means, the newest step weighing 0.3
    assert costs.rate == pytest.approx((5.0 - 0.3 * 4.0) / (2.5 - 0.3 * 0.5))
    # Steps with nothing drafted (a lookup that found no match, the gate's plain steps) bring the rate back toward
    # 1, so that after a rich stretch a lookup is not held to it forever; the gate's own rate ignores them.
    for _ in range(20):
        costs.observe_step(gained=1.0, cost=1.0, speculative=False)
    assert costs.rate == pytest.approx(1.0, abs=0.01)
    assert costs.step_rate == pytest.approx((5.0 - 0.3 * 4.0) / (2.5 - 0.3 * 0.5))
    losing = CostModel(fixed=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.0))
    losing.observe_step(gained=1.0, cost=2.0)
    assert losing.step_rate == pytest.approx(0.5) and losing.rate == 1.0  # never below plain decoding's


def test_a_chain_stops_sooner_when_steps_already_bring_more_per_second() -> None:
    """The draft is 80% sure at every position and a draft forward costs 0.3 plain steps: after k drafts, one
    more is expected to bring 0.8 ** (k + 1) tokens. At break-even drafting stops after 5 (0.8 ** 6 < 0.3); when
    recent steps brought 2 tokens per plain step, after 2 (0.8 ** 3 < 0.6)."""

    costs = CostModel(fixed=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.0))

    def drafted(policy: DraftLengthPolicy) -> int:
        policy.start_step()
        confidence = torch.tensor([[0.8, 0.2]])
        return next(k for k in range(1, 9) if policy.should_stop(confidence, costs) or k == 8)

    policy = DraftLengthPolicy(num_tokens=8)
    assert drafted(policy) == 5
    costs.observe_step(gained=5.0, cost=2.5)
    assert drafted(policy) == 2


# Drafting never pays on this synthetic machine: a draft forward costs a whole target forward, and every
# verified token half of one.
EXPENSIVE = SpeculativeCosts(draft_forward=1.0, verify_per_token=0.5)
FREE = SpeculativeCosts(draft_forward=0.0, verify_per_token=0.0)


def _generate(path: str, costs: SpeculativeCosts, twin: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Greedy speculative and plain outputs of one path, and how many plain steps the gate took."""
    target = hf_specdec.speculative(tiny_model("llama", seed=0, sharpen=4.0))
    ids, mask = ragged_batch(3, seed=2)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 40, "do_sample": False}
    plain = target.generate(**kwargs)
    draft = tiny_model("llama", seed=0 if twin else 5, sharpen=4.0)
    kwargs |= {"return_dict_in_generate": True, "speculative_costs": costs}
    if path == "assistant":
        out = target.generate(assistant=draft, **kwargs)
    elif path == "assistant-tree":
        out = target.generate(assistant=draft, tree=DynamicTree(num_nodes=6, depth=3, top_k=2), **kwargs)
    elif path == "lookup":
        out = target.generate(prompt_lookup_num_tokens=4, **kwargs)
    elif path == "hybrid":
        out = target.generate(assistant=draft, prompt_lookup_num_tokens=4, **kwargs)
    else:
        torch.manual_seed(3)
        head_type = "eagle" if path == "eagle" else "medusa"
        model = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=3, head_type=head_type))
        out = model.generate(medusa=True, tree=DynamicTree(num_nodes=6), **kwargs)
    return out.sequences, plain, out.speculative.plain_steps


@pytest.mark.parametrize("path", ["assistant", "assistant-tree", "hybrid", "medusa", "eagle"])
def test_plain_steps_keep_plain_greedy_tokens(path: str) -> None:
    sequences, plain, plain_steps = _generate(path, EXPENSIVE, twin=False)
    assert plain_steps > 0
    assert torch.equal(sequences, plain)


@pytest.mark.parametrize("path", ["assistant", "assistant-tree", "lookup", "hybrid", "medusa", "eagle"])
def test_drafters_follow_plain_steps_between_their_own(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every other step plain, whatever the costs: each drafter catches up on tokens it did not draft."""
    calls = iter(range(10**6))

    def alternate(self: SpeculationGate, rows: int) -> bool:
        plain = next(calls) % 2 == 1
        self.measuring = plain  # plain for certain: no free proposal (the hybrid's lookup) takes the step
        return not plain

    monkeypatch.setattr(SpeculationGate, "speculate", alternate)
    sequences, plain, plain_steps = _generate(path, FREE, twin=True)
    assert plain_steps > 1
    assert torch.equal(sequences, plain)


@pytest.mark.parametrize("path", ["assistant", "assistant-tree"])
def test_no_plain_steps_where_drafting_pays(path: str) -> None:
    sequences, plain, plain_steps = _generate(path, FREE, twin=True)
    assert plain_steps == 0
    assert torch.equal(sequences, plain)


@pytest.mark.parametrize("path", ["assistant", "assistant-tree", "hybrid"])
def test_a_step_that_catches_the_draft_up_does_not_price_a_draft_forward(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two plain steps between drafting ones: each drafting step first feeds the draft three or more tokens per
    row it has not seen, a forward that costs more than a draft forward; the cost model learns `c` from the
    other steps only."""
    pattern = iter([True, True] + [False, False, True] * 10**5)

    def every_third(self: SpeculationGate, rows: int) -> bool:
        return next(pattern)

    seen: list[tuple[bool, int]] = []  # (the proposal caught up, draft forwards the cost model was told of)
    proposals: list[bool] = []
    observe = CostModel.observe
    verified = hf_specdec.generation.step_clock.StepClock.verified

    def record_observe(self: CostModel, draft_seconds, draft_forwards, *args, **kwargs) -> None:
        seen.append((proposals[-1], draft_forwards))
        observe(self, draft_seconds, draft_forwards, *args, **kwargs)

    def record_verified(self, forwards, rows, width, gained, catch_up=False, free=False, started=False):
        proposals.append(catch_up)
        return verified(self, forwards, rows, width, gained, catch_up, free, started)

    monkeypatch.setattr(SpeculationGate, "speculate", every_third)
    monkeypatch.setattr(CostModel, "observe", record_observe)
    monkeypatch.setattr(hf_specdec.generation.step_clock.StepClock, "verified", record_verified)
    sequences, plain, _ = _generate(path, FREE, twin=True)
    assert torch.equal(sequences, plain)
    assert not seen[0][0] and seen[0][1] > 0  # a drafting step right after another: priced
    caught_up = [forwards for catch_up, forwards in seen if catch_up]
    assert caught_up and all(forwards == 0 for forwards in caught_up)


def test_a_lookup_step_pays_for_the_draft_catching_up_after_it() -> None:
    """The draft model's recent steps brought 2.5 tokens per row for 2 forwards of 0.3 plain steps (1 + 0.6 +
    0.05 * 4 rows * 2 = 2.0 plain steps: 1.25 tokens per plain step). A lookup of 4 drafts per row that brings
    2.3 tokens costs 1 + 0.05 * 4 * 4 = 1.8 plain steps (1.28 tokens per plain step, more), but leaves the draft
    1.3 tokens per row to feed, 0.3 * 0.05 * 4 * 1.3 = 0.078 plain steps more (1.22: less); at 2.5 tokens it
    still wins (2.5 / 1.89 = 1.32)."""
    costs = CostModel(fixed=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.05))
    lookup_pays_more = hf_specdec.generation.decisions.lookup_pays_more
    assert not lookup_pays_more(costs, rows=4, lookup_tokens=2.3, lookup_width=4, model_tokens=2.5, model_drafts=2)
    assert lookup_pays_more(costs, rows=4, lookup_tokens=2.5, lookup_width=4, model_tokens=2.5, model_drafts=2)


def test_a_free_step_taken_while_the_gate_waits_leaves_the_wait_as_it_is() -> None:
    gate = SpeculationGate(CostModel(fixed=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.05)))
    assert gate.speculate(4)
    gate.observe(1.5, seconds=0.0, draft_forwards=4, rows=4, verified_per_row=5, verify_seconds=0.0)  # lost
    assert not gate.speculate(4)
    # The loop verified free drafts in that step: it lost too, but was not the gate's to judge.
    gate.observe(1.0, seconds=0.0, draft_forwards=0, rows=4, verified_per_row=5, verify_seconds=0.0, free=True)
    assert [gate.speculate(4) for _ in range(2)] == [False, True]  # the first wait, not a doubled one
