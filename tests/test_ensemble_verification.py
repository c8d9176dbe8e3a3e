"""`assistant_ensemble_weight=w` (opt-in, lossy): drafted tokens follow `w * p + (1 - w) * q` instead of the
target's `p`, checked by a chi-square test against that mix computed exactly; `w = 1` is exact speculative
sampling, draw for draw; what it cannot apply to is refused."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

import hf_specdec
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, sample_copies
from tests.test_sampling_distribution import PAD, PROMPT_A, VOCAB, _models

COSTS = hf_specdec.SpeculativeCosts(draft_forward=0.1, verify_per_token=0.01)
DRAFT_ONE = {"num_assistant_tokens": 1, "num_assistant_tokens_schedule": "constant", "top_k": None}


def _samples(weight: float | None, seed: int) -> torch.Tensor:
    target, draft = _models()
    extra = {} if weight is None else {"assistant_ensemble_weight": weight}
    (samples,), stats = sample_copies(
        target, (PROMPT_A,), 6000, PAD, 2, seed, assistant=draft, speculative_costs=COSTS, **DRAFT_ONE, **extra
    )
    assert int(stats.drafted_tokens.sum()) > 0
    return samples


@pytest.mark.parametrize("weight", [0.3, 0.7])
def test_drafted_tokens_follow_the_mix_of_the_two_distributions(weight: float) -> None:
    """Two tokens: the first from the target's prefill (`p`), the second drafted by the draft (one token per
    step) and verified against the mix."""
    target, draft = _models()
    p = exact_joint(target, PROMPT_A, LogitsProcessorList(), VOCAB, 2)  # p(t1) p(t2 | t1)
    q = exact_joint(draft, PROMPT_A, LogitsProcessorList(), VOCAB, 2)
    p1, q1 = p.sum(dim=1), q.sum(dim=1)
    mix = p1[:, None] * (weight * p / p1[:, None] + (1 - weight) * q / q1[:, None])
    samples = _samples(weight, seed=11)
    assert chisquare_pvalue(samples, mix) > 1e-3
    assert chisquare_pvalue(samples, p) < 1e-6  # and not the target's distribution: the mode is lossy


def test_a_weight_of_one_is_exact_sampling_draw_for_draw() -> None:
    assert torch.equal(_samples(1.0, seed=5), _samples(None, seed=5))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"do_sample": False}, "pass do_sample=True"),
        ({"assistant_ensemble_weight": 0.0}, r"in \(0, 1\]"),
        ({"assistant_ensemble_weight": 1.5}, r"in \(0, 1\]"),
        ({"prompt_lookup_num_tokens": 3}, "cannot be combined with prompt lookup"),
    ],
)
def test_what_the_ensemble_cannot_apply_to_is_refused(extra: dict, match: str) -> None:
    target, draft = _models()
    call = {"input_ids": torch.tensor([PROMPT_A]), "max_new_tokens": 3, "do_sample": True, "assistant": draft}
    with pytest.raises(ValueError, match=match):
        target.generate(**{**call, "assistant_ensemble_weight": 0.5, **extra})
    with pytest.raises(ValueError, match="needs `assistant=`"):
        target.generate(input_ids=call["input_ids"], prompt_lookup_num_tokens=3, assistant_ensemble_weight=0.5)
