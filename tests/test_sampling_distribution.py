"""Statistical tests that speculative sampling emits exactly the target's distribution.

A tiny-vocabulary target and a clearly different draft decode a few thousand copies of one prompt in one
batch (rows are independent samples). The target's exact distribution over the next tokens is enumerated
with plain forward passes (vocab**depth sequences), through the same logits warpers `generate()` applies,
and the samples are compared with it by chi-square goodness-of-fit tests:

    the 1st token, the first 2 and first 3 tokens jointly, the 4th and 5th tokens, and pairs of them.

With `max_new_tokens=5` the 1st token comes from the prefill; tokens 2-5 come from speculative steps (whose
draft length never exceeds what can still be committed), so they are accepted drafts, resamples from the
residual at draft positions 1, 2 and 3, and bonus tokens (on the 4th token with 2 drafts, the 5th with 3).

Significance level: a check fails when p < ALPHA = 1e-3. Every run uses a fixed generator seed, so the
tests are deterministic; with ~40 checks in the file a correct implementation would fail one of them for
about 4% of seeds, and these seeds pass. The negative controls require p < 1e-6 for broken rules, so the
checks have power against the errors an acceptance rule is likely to contain.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)

import hf_specdec
import hf_specdec.generation.run
from hf_specdec.generation.acceptance import residual_distribution, sample_accept_tree, speculative_sampling
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, marginal, sample_copies, sampling_warpers

VOCAB = 8
PAD = 0
MAX_NEW = 5
NUM_SAMPLES = 8000  # rows per prompt
ALPHA = 1e-3  # reject "samples follow the target's distribution" at p < ALPHA
POWER_ALPHA = 1e-6  # negative controls: a wrong distribution must be rejected at p < POWER_ALPHA
PROMPT_A = (1, 5, 2, 7, 3)
PROMPT_B = (6, 4)  # shorter, left-padded when batched with PROMPT_A

SAMPLING = {
    "plain": {"temperature": 1.0, "top_k": None, "top_p": None},
    # top_k keeps 6 of 8 tokens, top_p then trims the tail further at most positions
    "warped": {"temperature": 0.7, "top_k": 6, "top_p": 0.9},
}

# (name, slice of generated token indices tested jointly)
CHECKS = (
    ("token 1", slice(0, 1)),
    ("tokens 1-2", slice(0, 2)),
    ("tokens 1-3", slice(0, 3)),
    ("token 4", slice(3, 4)),
    ("tokens 3-4", slice(2, 4)),
    ("token 5", slice(4, 5)),
    ("tokens 4-5", slice(3, 5)),
)


# ---------------------------------------------------------------------------------------------------------
# Models and exact distributions
# ---------------------------------------------------------------------------------------------------------


def _tiny_llama(seed: int, num_layers: int, sharpen: float) -> PreTrainedModel:
    """A seeded random Llama over VOCAB tokens in float32; `sharpen` scales the output layer (peakier)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=None,  # no early stops: every row generates exactly MAX_NEW tokens
        pad_token_id=PAD,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


@functools.cache
def _models() -> tuple[PreTrainedModel, PreTrainedModel]:
    target = hf_specdec.speculative(_tiny_llama(seed=0, num_layers=2, sharpen=8.0))
    draft = _tiny_llama(seed=1, num_layers=1, sharpen=8.0)  # different weights and depth
    return target, draft


@functools.cache
def _target_joint(prompt: tuple[int, ...], mode: str) -> torch.Tensor:
    return exact_joint(_models()[0], prompt, sampling_warpers(**SAMPLING[mode]), VOCAB, MAX_NEW)


@functools.cache
def _draft_joint(prompt: tuple[int, ...], mode: str) -> torch.Tensor:
    return exact_joint(_models()[1], prompt, sampling_warpers(**SAMPLING[mode]), VOCAB, MAX_NEW)


# ---------------------------------------------------------------------------------------------------------
# Sampling and the goodness-of-fit test
# ---------------------------------------------------------------------------------------------------------


def _speculative_samples(
    prompts: tuple[tuple[int, ...], ...],
    num_assistant_tokens: int,
    mode: str,
    seed: int,
    schedule: str = "constant",
    **extra: Any,
) -> tuple[list[torch.Tensor], hf_specdec.SpeculativeStats]:
    """Generate MAX_NEW tokens for NUM_SAMPLES copies of each prompt in one left-padded batch, rows of the
    prompts interleaved. Returns the generated tokens `(NUM_SAMPLES, MAX_NEW)` of each prompt and the stats."""
    target, draft = _models()
    sampling = {k: v for k, v in SAMPLING[mode].items() if v is not None}
    return sample_copies(
        target,
        prompts,
        NUM_SAMPLES,
        PAD,
        MAX_NEW,
        seed,
        assistant=draft,
        num_assistant_tokens=num_assistant_tokens,
        num_assistant_tokens_schedule=schedule,  # "constant": every step drafts exactly this many
        **sampling,
        **extra,
    )


@functools.cache
def _cached_samples(
    prompts: tuple[tuple[int, ...], ...], num_assistant_tokens: int, mode: str, seed: int
) -> tuple[list[torch.Tensor], hf_specdec.SpeculativeStats]:
    return _speculative_samples(prompts, num_assistant_tokens, mode, seed)


def _pvalues(samples: torch.Tensor, joint: torch.Tensor) -> dict[str, float]:
    return {name: chisquare_pvalue(samples[:, cols], marginal(joint, cols)) for name, cols in CHECKS}


def _check_acceptance(stats: hf_specdec.SpeculativeStats, num_assistant_tokens: int) -> None:
    """Both paths must really run: drafts are accepted and rejected often, at every draft position."""
    rate = stats.summary()["acceptance_rate"]
    assert 0.1 < rate < 0.95, rate
    drafted, accepted = stats.drafted_at_position, stats.accepted_at_position
    assert drafted.numel() == num_assistant_tokens
    assert bool((accepted > 0).all() and (accepted < drafted).all()), (drafted, accepted)


# ---------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_assistant_tokens", [2, 3])
@pytest.mark.parametrize("mode", ["plain", "warped"])
def test_samples_follow_target_distribution(mode: str, num_assistant_tokens: int) -> None:
    (samples,), stats = _cached_samples((PROMPT_A,), num_assistant_tokens, mode, seed=1234)
    _check_acceptance(stats, num_assistant_tokens)
    pvalues = _pvalues(samples, _target_joint(PROMPT_A, mode))
    assert min(pvalues.values()) >= ALPHA, pvalues


@pytest.mark.parametrize("schedule", ["adaptive", "heuristic"])
def test_draft_length_schedules_keep_the_target_distribution(schedule: str) -> None:
    """Draft lengths that change from step to step (on the draft's confidence, or on acceptance history)
    decide only how much is proposed, never what is accepted: the distribution stays the target's."""
    (samples,), _ = _speculative_samples((PROMPT_A,), 4, "warped", seed=4321, schedule=schedule)
    pvalues = _pvalues(samples, _target_joint(PROMPT_A, "warped"))
    assert min(pvalues.values()) >= ALPHA, pvalues


@pytest.mark.parametrize(("mode", "num_assistant_tokens"), [("plain", 2), ("warped", 3)])
def test_left_padded_ragged_batch_rows_follow_their_own_distribution(mode: str, num_assistant_tokens: int) -> None:
    """Two prompts of different lengths, interleaved in one left-padded batch: each row must follow the
    distribution of its own (unpadded) prompt."""
    (samples_a, samples_b), stats = _cached_samples((PROMPT_A, PROMPT_B), num_assistant_tokens, mode, seed=99)
    _check_acceptance(stats, num_assistant_tokens)
    for samples, prompt in ((samples_a, PROMPT_A), (samples_b, PROMPT_B)):
        pvalues = _pvalues(samples, _target_joint(prompt, mode))
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)
    # The two prompts' distributions differ enough that rows following the other prompt would be caught.
    swapped = _pvalues(samples_b, _target_joint(PROMPT_A, mode))
    assert min(swapped.values()) < POWER_ALPHA, swapped


def test_a_static_cache_keeps_the_target_distribution() -> None:
    """`cache_implementation="static"`: preallocated slots, rolled back by moving a pointer, in a ragged batch."""
    (samples_a, samples_b), stats = _speculative_samples(
        (PROMPT_A, PROMPT_B), 3, "warped", seed=2718, cache_implementation="static"
    )
    _check_acceptance(stats, 3)
    for samples, prompt in ((samples_a, PROMPT_A), (samples_b, PROMPT_B)):
        pvalues = _pvalues(samples, _target_joint(prompt, "warped"))
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)


@pytest.mark.parametrize("mode", ["plain", "warped"])
def test_a_draft_vocabulary_keeps_the_target_distribution(mode: str) -> None:
    """A draft that may propose only every other token (q is zero on the rest): the tokens it cannot propose
    come from the residual, and the output still follows the target's distribution."""
    vocab = torch.arange(0, VOCAB, 2)
    (samples,), stats = _speculative_samples((PROMPT_A,), 3, mode, seed=777, assistant_vocab=vocab)
    assert 0.05 < stats.summary()["acceptance_rate"] < 0.95
    pvalues = _pvalues(samples, _target_joint(PROMPT_A, mode))
    assert min(pvalues.values()) >= ALPHA, pvalues


def test_a_quantised_draft_keeps_the_target_distribution() -> None:
    """A draft whose linear layers are int8 (torch's dynamic quantisation): acceptance weighs the quantised
    draft's own q, and the output follows the target's distribution."""
    import copy
    import warnings

    target, draft = _models()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's quantised tensors are deprecated in favour of torchao
        quantised = torch.ao.quantization.quantize_dynamic(copy.deepcopy(draft), {torch.nn.Linear}, dtype=torch.qint8)
    assert callable(quantised.get_output_embeddings().weight)
    sampling = {k: v for k, v in SAMPLING["plain"].items() if v is not None}
    (samples,), stats = sample_copies(
        target, (PROMPT_A,), NUM_SAMPLES, PAD, MAX_NEW, 4321, assistant=quantised, num_assistant_tokens=3,
        num_assistant_tokens_schedule="constant", **sampling,
    )  # fmt: skip
    _check_acceptance(stats, 3)
    pvalues = _pvalues(samples, _target_joint(PROMPT_A, "plain"))
    assert min(pvalues.values()) >= ALPHA, pvalues


def test_negative_control_draft_distribution_is_rejected() -> None:
    """The checks can tell the target's distribution from what a rule that keeps the draft's proposals
    would emit. The 1st token comes from the target's prefill, not from a speculative step, so the control
    uses the first speculated token: tokens 1-2 jointly against p_target(t1) * q_draft(t2 | t1)."""
    (samples,), _ = _cached_samples((PROMPT_A,), 2, "plain", seed=1234)
    target_first = marginal(_target_joint(PROMPT_A, "plain"), slice(0, 1))  # (V,)
    draft_pair = marginal(_draft_joint(PROMPT_A, "plain"), slice(0, 2))  # (V, V)
    draft_next = draft_pair / draft_pair.sum(dim=1, keepdim=True)  # q(t2 | t1)
    pvalue = chisquare_pvalue(samples[:, :2], target_first[:, None] * draft_next)
    assert pvalue < POWER_ALPHA, pvalue


# Broken acceptance rules, with `speculative_sampling`'s signature, for the power tests below.


def _accept_all(draft_tokens, q, p, generator=None):
    """Keeps every draft (emits the draft's distribution), then a bonus token from p."""
    batch, k = draft_tokens.shape
    next_token = torch.multinomial(p[:, k], 1, generator=generator).squeeze(1)
    return torch.full((batch,), k, dtype=torch.long, device=p.device), next_token


def _resample_from_target(draft_tokens, q, p, generator=None):
    """Correct acceptance test, but resamples from p instead of the residual max(0, p - q) after a rejection."""
    batch, k = draft_tokens.shape
    p_x = p[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)
    q_x = q.gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand((batch, k), dtype=p.dtype, generator=generator)
    num_accepted = (u * q_x < p_x).long().cumprod(dim=1).sum(dim=1)
    final = p[torch.arange(batch), num_accepted]
    return num_accepted, torch.multinomial(final, 1, generator=generator).squeeze(1)


def _accept_with_target_probability(draft_tokens, q, p, generator=None):
    """Accepts a draft with probability p(x) instead of min(1, p(x) / q(x)); residual as usual."""
    batch, k = draft_tokens.shape
    p_x = p[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand((batch, k), dtype=p.dtype, generator=generator)
    num_accepted = (u < p_x).long().cumprod(dim=1).sum(dim=1)
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
    rows = torch.arange(batch)
    final = residual_distribution(p[rows, num_accepted], q_padded[rows, num_accepted])
    return num_accepted, torch.multinomial(final, 1, generator=generator).squeeze(1)


def _bonus_from_last_draft_position(draft_tokens, q, p, generator=None):
    """Correct, except that the bonus token (all k drafts accepted) is drawn from p at the k-th draft's
    position instead of the position after it. Only the 3rd and 4th tokens jointly can see this."""
    k = draft_tokens.shape[1]
    shifted = torch.cat([p[:, :k], p[:, k - 1 : k]], dim=1)
    return speculative_sampling(draft_tokens, q, shifted, generator)


@pytest.mark.parametrize(
    "broken_rule",
    [_accept_all, _resample_from_target, _accept_with_target_probability, _bonus_from_last_draft_position],
    ids=["accept_all", "resample_from_target", "accept_with_p", "bonus_off_by_one"],
)
def test_negative_control_broken_acceptance_rules_are_detected(
    broken_rule: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same checks as the positive tests reject the output of broken acceptance rules (p < 1e-6)."""

    def on_chains(nodes, p, trees, generator=None, q=None):  # the loop verifies a chain as a tree
        k = nodes.shape[1] - 1
        if q is None:  # a plain step (the speculation gate): nothing drafted, the target's own token
            return sample_accept_tree(nodes, p, trees, generator)
        num_accepted, next_token = broken_rule(nodes[:, 1:], q[:, :k], p, generator)
        return num_accepted, num_accepted, next_token

    monkeypatch.setattr(hf_specdec.generation.run, "sample_accept_tree", on_chains)
    (samples,), _ = _speculative_samples((PROMPT_A,), 2, "plain", seed=1234)
    pvalues = _pvalues(samples, _target_joint(PROMPT_A, "plain"))
    assert min(pvalues.values()) < POWER_ALPHA, pvalues
