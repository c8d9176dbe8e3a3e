"""A draft model and prompt lookup together: each step drafts with one of them, outputs stay the target's."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.drafters.draft_model import DraftModelDrafter
from hf_specdec.drafters.hybrid import HybridDrafter
from hf_specdec.generation.decisions import SpeculationGate, SpeculativeCosts
from hf_specdec.generation.processing import RaggedLogitsProcessor
from tests.goodness_of_fit import sample_copies
from tests.test_sampling_distribution import (
    ALPHA,
    MAX_NEW,
    PAD,
    PROMPT_A,
    PROMPT_B,
    SAMPLING,
    _models,
    _pvalues,
)
from tests.test_sampling_distribution import _target_joint as sampling_joint
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model, tiny_target

NEW = 40


@pytest.fixture
def alternating(monkeypatch):
    """Make every other step a lookup step (when the lookup found anything): both sources and the draft
    model's catch-up after lookup steps run deterministically, whatever the measured costs."""
    turns = itertools.cycle([True, False])

    def lookup_pays(self, looked_up, rows, policy) -> bool:
        return looked_up.tokens.shape[1] > 0 and next(turns)

    monkeypatch.setattr(HybridDrafter, "_lookup_pays", lookup_pays)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
def test_alternating_sources_match_plain_greedy(arch: str, batch: int, alternating) -> None:
    target = tiny_target(arch)
    draft = tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(batch, seed=batch)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        assistant=draft,
        num_assistant_tokens=3,
        prompt_lookup_num_tokens=5,
        num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    stats = out.speculative
    steps = int(stats.target_forwards.max())
    assert 0 < stats.lookup_steps < steps  # both sources drafted
    assert int(stats.accepted_tokens.sum()) > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_measured_choice_matches_plain_greedy(arch: str) -> None:
    """Without forcing: the choice follows measured costs, so only identity is deterministic."""
    target = tiny_target(arch)
    draft = tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=5)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        assistant=draft,
        prompt_lookup_num_tokens=6,
    )
    assert torch.equal(out, plain)


def test_draft_model_catches_up_on_committed_tokens() -> None:
    """After a lookup step the draft model has not seen the committed tokens: they join the tokens it had not
    seen yet, right-aligned, to be fed in one forward."""
    drafter = DraftModelDrafter(
        tiny_model("llama", seed=0), 96, RaggedLogitsProcessor(LogitsProcessorList()), do_sample=False
    )
    drafter.pending = torch.tensor([[0, 7], [5, 6]])
    drafter.pending_count = torch.tensor([1, 2])
    drafter._pending_most = 2  # the host's bound on pending_count, kept with it
    drafter.catch_up(torch.tensor([[11, 12, 13], [21, 22, 23]]), torch.tensor([3, 1]), most=3)
    # Width: the most it had not seen plus the most committed (known to the host without reading the counts).
    assert drafter.pending.tolist() == [[0, 7, 11, 12, 13], [0, 0, 5, 6, 21]]
    assert drafter.pending_count.tolist() == [4, 3]


@pytest.mark.parametrize(("mode", "num_tokens"), [("plain", 2), ("warped", 3)])
def test_samples_follow_target_distribution(mode: str, num_tokens: int, alternating) -> None:
    """Steps drafted by the model (q from the draft) and by lookup (certain drafts) alternate in every row of a
    ragged batch; the samples must follow the target's distribution."""
    target, draft = _models()
    sampling = {k: v for k, v in SAMPLING[mode].items() if v is not None}
    prompts = (PROMPT_A, PROMPT_B)
    samples, stats = sample_copies(
        target,
        prompts,
        4000,
        PAD,
        MAX_NEW,
        78,
        assistant=draft,
        num_assistant_tokens=num_tokens,
        prompt_lookup_num_tokens=num_tokens,
        num_assistant_tokens_schedule="constant",
        **sampling,
    )
    assert stats.lookup_steps > 0
    for generated, prompt in zip(samples, prompts, strict=True):
        pvalues = _pvalues(generated, sampling_joint(prompt, mode))
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_draft_cache_stays_in_sync_across_lookup_steps(arch: str, monkeypatch, alternating) -> None:
    """With the target as its own draft, every model step must accept all its drafts: a draft cache that
    missed or repeated a token committed by a lookup step would propose something else."""
    target = tiny_target(arch)
    model_steps: list[tuple[list[int], int]] = []
    commit = HybridDrafter.commit_chain

    def recording_commit(self, num_accepted, num_drafted, next_token, outcome=None):
        if not self.last.looked_up:
            model_steps.append((num_accepted.tolist(), num_drafted))
        commit(self, num_accepted, num_drafted, next_token, outcome)

    monkeypatch.setattr(HybridDrafter, "commit_chain", recording_commit)
    ids, mask = ragged_batch(3, seed=11)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        assistant=copy.deepcopy(target),
        num_assistant_tokens=3,
        prompt_lookup_num_tokens=4,
        num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True,
    )
    assert out.speculative.lookup_steps > 0 and len(model_steps) > 1
    assert all(all(a == drafted for a in accepted) for accepted, drafted in model_steps), model_steps


def test_lookup_learns_from_model_steps() -> None:
    """On a model step, the lookup's own proposal is scored against the committed tokens: positions it got
    right count as accepted, the first wrong one as rejected, positions past the committed ones not at all."""
    from hf_specdec.drafters.lookup import PromptLookupDrafter

    lookup = PromptLookupDrafter(num_tokens=4, max_ngram_size=1)
    lookup._sizes = [1, 1]
    lookup._tokens, lookup._lengths = [[5, 6, 7, 8], [5, 6, 7, 8]], [4, 4]  # what it looked up last
    # Row 0 committed 5, 6, 9 (two right, then wrong); row 1 committed only 5 (one right, the rest unknown).
    lookup.observe([[5, 6, 9], [5]])
    history = lookup.history[1]
    assert history._reached[:3] == pytest.approx([2.0, 1.0, 1.0])
    assert history._accepted[:3] == pytest.approx([2.0, 1.0, 0.0])


def test_catching_up_keeps_padding_positions_in_range() -> None:
    """Found by the fuzzer: after a lookup step, rows catch up on different numbers of tokens; the padding
    before a row's pending tokens must get a valid position, or a draft with learned positions (GPT-2) fails."""
    from hf_specdec.generation.decisions import CostModel
    from hf_specdec.generation.sequences import TokenBuffer

    draft = tiny_model("gpt2", seed=0, num_layers=1)
    schedule = DraftLengthPolicy(2, "constant")
    processors = RaggedLogitsProcessor(LogitsProcessorList())
    drafter = DraftModelDrafter(draft, 96, processors, do_sample=False, schedule=schedule)
    ids = torch.tensor([[0, 0, 0, 5], [5, 6, 7, 8]])
    mask = (ids != 0).long()
    drafter.prefill(ids, mask.bool(), (mask.cumsum(1) - 1).clamp_min(0))
    drafter.start(torch.tensor([9, 9]))
    drafter.catch_up(torch.tensor([[11, 12, 13, 14, 15, 16], [21, 0, 0, 0, 0, 0]]), torch.tensor([6, 1]))
    config = GenerationConfig(max_length=40)
    config._eos_token_tensor = config._pad_token_tensor = None  # as generate() prepares them
    buffer = TokenBuffer(ids, config, StoppingCriteriaList(), scratch=8)
    chain = drafter.draft_chain(buffer, torch.tensor([8, 6]), CostModel(), max_tokens=2)
    assert chain.tokens.shape == (2, 2)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_lookup_proposes_while_the_gate_keeps_the_draft_model_waiting(batch: int, monkeypatch) -> None:
    """While the gate keeps steps plain (here two of every three, whatever drafting brings), the lookup, whose
    drafts cost no forward, still proposes on those steps, and the draft model drafts on the others; outputs
    stay plain greedy's."""
    free: list[int] = []
    propose_free = HybridDrafter.propose_free
    steps = itertools.count()

    def waiting(self: SpeculationGate, rows: int) -> bool:
        self.measuring = False
        return next(steps) % 3 == 2

    monkeypatch.setattr(SpeculationGate, "speculate", waiting)

    def counting(self, *args, **kwargs):
        proposal = propose_free(self, *args, **kwargs)
        free.append(0 if proposal is None else int(proposal.nodes.shape[1] - 1))
        return proposal

    monkeypatch.setattr(HybridDrafter, "propose_free", counting)
    target = tiny_target("llama")
    draft = tiny_model("llama", seed=3, num_layers=1)
    ids, mask = ragged_batch(batch, seed=4)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        assistant=draft,
        prompt_lookup_num_tokens=4,
        speculative_costs=SpeculativeCosts(draft_forward=0.3, verify_per_token=0.01),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    stats = out.speculative
    assert stats.draft_forwards > 0
    assert free and max(free) > 0  # the gate waited, and the lookup drafted during the wait
    assert stats.lookup_steps >= sum(1 for k in free if k > 0)
    assert stats.plain_steps >= sum(1 for k in free if k == 0)  # the steps it drafted in are not plain ones
