"""Prompt lookup drafting: the n-gram search, greedy identity at any batch size, the sampling distribution,
and errors."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteriaList

import hf_specdec.generation.run
from hf_specdec.drafters.lookup import PromptLookupDrafter, lookup_continuation
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.sequences import TokenBuffer
from tests.goodness_of_fit import sample_copies
from tests.test_sampling_distribution import (
    ALPHA,
    MAX_NEW,
    PAD,
    POWER_ALPHA,
    PROMPT_A,
    PROMPT_B,
    SAMPLING,
    _models,
    _pvalues,
)
from tests.test_sampling_distribution import _target_joint as sampling_joint
from tests.test_tree_sampling_distribution import BROKEN_RULES
from tests.tiny_models import BUILDERS, ragged_batch, tiny_target

NEW = 40


def _t(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens)


@pytest.mark.parametrize(
    ("tokens", "ngram", "num", "expected", "size"),
    [
        ((5, 6, 7, 8, 5, 6), 2, 3, (7, 8, 5), 2),  # bigram (5, 6) seen at 0: propose what followed
        ((5, 6, 7, 9, 6, 1, 2, 5, 6), 2, 2, (7, 9), 2),
        ((1, 6, 2, 3, 6, 4, 6), 2, 2, (4, 6), 1),  # no earlier bigram (4, 6): most recent unigram 6, at 4
        ((1, 2, 9, 1, 2, 7, 1, 2), 2, 1, (7,), 2),  # two earlier matches: the most recent one
        ((3, 4, 5, 3, 4), 3, 7, (5, 3, 4, 5, 3, 4, 5), 2),  # reaches the row's end: repeats with period 3
        ((9, 5, 5, 5, 5), 3, 4, (5, 5, 5, 5), 3),  # a run of one token continues
        ((1, 2, 3, 4), 2, 5, (), 0),  # nothing repeats
        ((7,), 2, 5, (), 0),
        ((4, 4), 2, 3, (4, 4, 4), 1),
    ],
)
def test_lookup_continuation(tokens, ngram, num, expected, size) -> None:
    continuation, matched = lookup_continuation(_t(*tokens), ngram, num)
    assert continuation == list(expected)
    assert matched == size


def test_lookup_prefers_the_longest_ngram() -> None:
    # unigram 3 last occurred at 5 (followed by 8); the trigram (1, 2, 3) at 0 (followed by 9)
    tokens = _t(1, 2, 3, 9, 0, 3, 8, 1, 2, 3)
    continuation, size = lookup_continuation(tokens, 3, 1)
    assert (continuation, size) == ([9], 3)
    continuation, size = lookup_continuation(tokens, 1, 1)
    assert (continuation, size) == ([8], 1)


def _buffer(rows: list[list[int]], pad: int = 0) -> tuple[TokenBuffer, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    config = GenerationConfig(max_length=width + 20)
    config._eos_token_tensor = None  # set by generate() when it prepares the special tokens
    return TokenBuffer(ids, config, StoppingCriteriaList(), scratch=8), valid


def test_drafter_proposes_per_row_lengths_and_never_matches_padding() -> None:
    # Row 0 ends with the pad id 0: without its start, the lookup would match its own left padding.
    buffer, valid = _buffer([[5, 0], [4, 6, 7, 4, 6], [1, 2, 3, 1]])
    drafter = PromptLookupDrafter(num_tokens=4, max_ngram_size=2)
    drafter.prefill(buffer.tokens[:, : valid.shape[1]], valid, torch.zeros_like(valid, dtype=torch.long))
    proposal = drafter.draft_chain(buffer, torch.zeros(3, dtype=torch.long), CostModel(), 10)
    assert proposal.lengths.tolist() == [0, 4, 4]  # row 0 has no match; the others repeat what they repeat
    assert proposal.tokens[1].tolist() == [7, 4, 6, 7] and proposal.tokens[2].tolist() == [2, 3, 1, 2]
    assert proposal.q is None and proposal.forwards == 0
    # The drafts sit after each row's tokens, uncommitted, for the logits processors of verification.
    assert buffer.tokens[1, 5:9].tolist() == [7, 4, 6, 7]
    assert buffer.lengths.tolist() == [5, 5, 5]
    # Rows leaving the batch leave the others' starts as they were.
    keep = buffer.retire([True, False, True])
    drafter.select_rows(keep)
    proposal = drafter.draft_chain(buffer, torch.zeros(1, dtype=torch.long), CostModel(), 10)
    assert proposal.lengths.tolist() == [4] and proposal.tokens.tolist() == [[7, 4, 6, 7]]


def test_the_batch_drafts_as_far_as_its_matches_pay() -> None:
    """Acceptance is measured per match size: single-token matches were never accepted, 3-token matches always
    were. Every row is verified to the same width, so the 3-token match sets it and the other row drafts as far
    (for free: it would be padded anyway); with no good match in the batch, nothing is drafted."""
    buffer, valid = _buffer([[9, 8, 1, 2, 3, 4, 5, 1], [7, 1, 2, 3, 4, 5, 6, 1, 2, 3]])
    drafter = PromptLookupDrafter(num_tokens=4, max_ngram_size=3)
    drafter.prefill(buffer.tokens[:, : valid.shape[1]], valid, torch.zeros_like(valid, dtype=torch.long))
    for _ in range(30):
        drafter.history[1].update(4, torch.zeros(2, dtype=torch.long))
        drafter.history[3].update(4, torch.full((2,), 4))
    policy = CostModel()
    for k in [0, 3, 1, 4, 2] * 3:  # verification: 0.1 of a one-token forward per extra token and row
        policy.observe(0.0, 0, 1.0 + 0.1 * (2 * (k + 1) - 2), rows=2, verified_per_row=k + 1)
    proposal = drafter.draft_chain(buffer, torch.zeros(2, dtype=torch.long), policy, 10)
    assert drafter._sizes == [1, 3]
    assert proposal.lengths.tolist() == [4, 4]
    assert proposal.tokens.tolist() == [[2, 3, 4, 5], [4, 5, 6, 1]]
    rate = drafter.history[3].acceptance_rate(0)  # about 19 remembered drafts, all accepted, and the prior
    assert rate > 0.95 and drafter.history[1].acceptance_rate(0) < 0.05
    expected = (drafter.history[1].expected_tokens([4]) + drafter.history[3].expected_tokens([4])) / 2
    assert drafter.expected_tokens() == pytest.approx(expected)
    assert drafter.history[3].expected_tokens([4]) == pytest.approx(1.0 + sum(rate**j for j in range(1, 5)), abs=0.01)
    # Once the rows' lengths differ, what counts is what drafts bring the least advanced row (the call ends
    # with it): row 0, one token behind, now ends with a 2-token match (never measured: the prior, 1/2), so
    # positions gain 0.5, 0.25, 0.125 against 0.2, whatever row 1's sure match would bring.
    buffer.commit(torch.tensor([[2, 0], [4, 5]]), torch.tensor([1, 2]), None)
    buffer.settle([[2], [4, 5]])  # the host's copy, as the loop's read of the step gives it
    proposal = drafter.draft_chain(buffer, torch.zeros(2, dtype=torch.long), policy, 10)
    assert drafter._sizes == [2, 3]
    assert proposal.lengths.tolist() == [2, 2]
    for _ in range(30):  # 2-token matches are never accepted either: nothing pays
        drafter.history[2].update(4, torch.zeros(2, dtype=torch.long))
    proposal = drafter.draft_chain(buffer, torch.zeros(2, dtype=torch.long), policy, 10)
    assert proposal.lengths.tolist() == [0, 0]


def test_without_the_adaptive_schedule_rows_draft_the_whole_length() -> None:
    """However bad the measured acceptance, a non-adaptive lookup drafts up to `num_tokens` per row."""
    buffer, valid = _buffer([[9, 8, 1, 2, 3, 4, 5, 6, 1]])
    drafter = PromptLookupDrafter(num_tokens=5, max_ngram_size=1, adaptive=False)
    drafter.prefill(buffer.tokens[:, : valid.shape[1]], valid, torch.zeros_like(valid, dtype=torch.long))
    drafter.history[1].update(5, torch.zeros(3, dtype=torch.long))
    proposal = drafter.draft_chain(buffer, torch.zeros(1, dtype=torch.long), CostModel(), 10)
    assert proposal.lengths.tolist() == [5]


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("num_tokens", "schedule"), [(1, "constant"), (5, "constant"), (5, "adaptive")])
def test_matches_plain_greedy(arch: str, batch: int, num_tokens: int, schedule: str) -> None:
    target = tiny_target(arch)
    ids, mask = ragged_batch(batch, seed=batch)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        prompt_lookup_num_tokens=num_tokens,
        num_assistant_tokens_schedule=schedule,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    stats = out.speculative
    assert stats.drafted_at_position.numel() <= num_tokens
    if schedule == "adaptive":  # lengths follow measured timings: only identity is deterministic
        return
    # Greedy tiny random models fall into loops, which lookup drafts: both acceptance and rejection happen.
    assert 0 < int(stats.accepted_tokens.sum()) < int(stats.drafted_tokens.sum())
    assert int(stats.target_forwards.max()) < NEW


def test_rows_stop_at_their_own_eos() -> None:
    target = tiny_target("llama")
    ids, mask = ragged_batch(3, seed=7)
    free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    eos = int(free[0, ids.shape[1] + 6])
    kwargs = {"max_new_tokens": NEW, "do_sample": False, "eos_token_id": eos, "pad_token_id": 0}
    plain = target.generate(input_ids=ids, attention_mask=mask, **kwargs)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        prompt_lookup_num_tokens=4,
        num_assistant_tokens_schedule="constant",
        **kwargs,
    )
    assert torch.equal(out, plain)


def _lookup_samples(prompts: tuple[tuple[int, ...], ...], num_tokens: int, mode: str, seed: int):
    sampling = {k: v for k, v in SAMPLING[mode].items() if v is not None}
    return sample_copies(
        _models()[0],
        prompts,
        4000,
        PAD,
        MAX_NEW,
        seed,
        prompt_lookup_num_tokens=num_tokens,
        max_matching_ngram_size=2,
        num_assistant_tokens_schedule="constant",  # deterministic lengths (adaptive ones follow timings)
        **sampling,
    )


@pytest.mark.parametrize(("mode", "num_tokens"), [("plain", 2), ("warped", 3)])
def test_samples_follow_target_distribution(mode: str, num_tokens: int) -> None:
    """Lookup drafts are certain (q = 1 on the drafted token): accepted with probability p(x), and after a
    rejection the next token comes from p without x. The samples must follow the target's distribution, row
    by row in a ragged batch (rows draft different numbers of tokens, or none)."""
    (samples_a, samples_b), stats = _lookup_samples((PROMPT_A, PROMPT_B), num_tokens, mode, seed=2024)
    rate = stats.summary()["acceptance_rate"]
    assert 0.1 < rate < 0.9, rate
    # Accepted drafts, rejections (resamples from p without x) and bonus tokens all occur, at two positions.
    drafted, accepted = stats.drafted_at_position[:2], stats.accepted_at_position[:2]
    assert bool(((accepted > 0) & (accepted < drafted)).all()), (drafted, accepted)
    for samples, prompt in ((samples_a, PROMPT_A), (samples_b, PROMPT_B)):
        pvalues = _pvalues(samples, sampling_joint(prompt, mode))
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_lookup_num_tokens": 0}, "positive integer"),
        ({"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 0}, "positive integer"),
        ({"prompt_lookup_num_tokens": 3, "num_assistant_tokens": 4}, "tunes the draft model"),
        ({"prompt_lookup_num_tokens": 3, "num_assistant_tokens_schedule": "heuristic"}, "'adaptive'"),
        ({"prompt_lookup_num_tokens": 3, "num_beams": 2}, "Beam search.*prompt lookup"),
        ({"prompt_lookup_num_tokens": 3, "assistant_vocab": [1, 2]}, "pass a draft model"),
    ],
)
def test_bad_settings(kwargs: dict, message: str) -> None:
    target = tiny_target("llama")
    ids, mask = ragged_batch(2)
    with pytest.raises(ValueError, match=message):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, **kwargs)


def test_the_distribution_check_catches_a_residual_that_keeps_the_rejected_token(monkeypatch) -> None:
    """Negative control: resampling from p itself after a rejection (instead of p without the rejected
    token) over-weights the drafted token, and the same check must see it."""

    monkeypatch.setattr(hf_specdec.generation.run, "sample_accept_tree", BROKEN_RULES["keep_rejected_mass"])
    (samples_a, _), _ = _lookup_samples((PROMPT_A, PROMPT_B), 2, "plain", seed=2024)
    assert min(_pvalues(samples_a, sampling_joint(PROMPT_A, "plain")).values()) < POWER_ALPHA
