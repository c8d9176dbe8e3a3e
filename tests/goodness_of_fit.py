"""Chi-square goodness of fit for sampled token sequences, and the exact distributions they are tested
against, shared by the statistical tests."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    PreTrainedModel,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def sampling_warpers(temperature: float, top_k: int | None, top_p: float | None) -> LogitsProcessorList:
    """The warpers `generate(do_sample=True)` builds, in transformers' order
    (`GenerationMixin._get_logits_processor`: temperature, top-k, top-p)."""
    processors = LogitsProcessorList()
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k:
        processors.append(TopKLogitsWarper(top_k=top_k))
    if top_p is not None and top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=top_p))
    return processors


@torch.no_grad()
def exact_joint(
    model: PreTrainedModel, prompt: tuple[int, ...], processors: LogitsProcessorList, vocab: int, num_tokens: int
) -> torch.Tensor:
    """The model's exact distribution over its next `num_tokens` tokens after `prompt`, by enumeration.

    Returns a float64 tensor of shape `(vocab,) * num_tokens`: entry `[t1, ..., tn]` is P(t1, ..., tn | prompt).
    """
    sequences = torch.tensor([prompt])  # (prefixes, length); prefix i spells i in base `vocab`
    joint = torch.ones(1, dtype=torch.float64)
    for _ in range(num_tokens):
        logits = model(sequences).logits[:, -1].float()  # (prefixes, V)
        probs = torch.softmax(processors(sequences, logits).double(), dim=-1)  # (prefixes, V)
        joint = (joint[:, None] * probs).reshape(-1)
        tokens = torch.arange(vocab).repeat(sequences.shape[0])[:, None]
        sequences = torch.cat([sequences.repeat_interleave(vocab, dim=0), tokens], dim=1)
    return joint.reshape((vocab,) * num_tokens)


def marginal(joint: torch.Tensor, columns: slice) -> torch.Tensor:
    """Marginal of a joint over `joint.dim()` tokens, keeping the tokens in `columns`."""
    keep = set(range(joint.dim())[columns])
    others = tuple(d for d in range(joint.dim()) if d not in keep)
    return joint.sum(dim=others) if others else joint


def chisquare_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of `samples` `(n, d)` (token ids) against `probs` `(vocab,) * d`.

    A sample in a cell of zero probability gives p = 0; with a single possible cell, p = 1 otherwise. Cells
    with expected count < 5 are pooled, and the pool is merged into the smallest other cell when it is itself
    below 5.
    """
    n, d = samples.shape
    vocab = probs.shape[0]
    codes = (samples.long() * vocab ** torch.arange(d - 1, -1, -1)).sum(dim=1).numpy()
    observed = np.bincount(codes, minlength=vocab**d).astype(np.float64)
    p = probs.reshape(-1).numpy().astype(np.float64)
    impossible = p == 0
    if observed[impossible].any():
        return 0.0
    if (~impossible).sum() == 1:
        return 1.0  # a certain outcome, and every sample has it
    expected = p / p.sum() * n
    large = expected >= 5
    obs, exp = list(observed[large]), list(expected[large])
    small = ~large & ~impossible
    if small.any():
        pooled_obs, pooled_exp = observed[small].sum(), expected[small].sum()
        if pooled_exp >= 5 or not exp:
            obs.append(pooled_obs)
            exp.append(pooled_exp)
        else:
            i = int(np.argmin(exp))
            obs[i] += pooled_obs
            exp[i] += pooled_exp
    assert len(exp) >= 2, "too few cells for a chi-square test"
    return float(chisquare(obs, exp).pvalue)


def sample_copies(
    model: PreTrainedModel,
    prompts: tuple[tuple[int, ...], ...],
    copies: int,
    pad: int,
    max_new_tokens: int,
    seed: int,
    **generate_kwargs,
) -> tuple[list[torch.Tensor], object]:
    """Sample `max_new_tokens` tokens for `copies` copies of each prompt in one left-padded batch (the prompts'
    rows interleaved; rows are independent samples), with `do_sample=True` and a seeded generator.

    Returns the generated tokens `(copies, max_new_tokens)` of each prompt, and the speculative statistics.
    """
    width = max(len(p) for p in prompts)
    rows = [prompts[i % len(prompts)] for i in range(copies * len(prompts))]
    input_ids = torch.tensor([(pad,) * (width - len(p)) + p for p in rows])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        max_new_tokens=max_new_tokens,
        generator=torch.Generator().manual_seed(seed),
        return_dict_in_generate=True,
        **generate_kwargs,
    )
    assert out.sequences.shape == (len(rows), width + max_new_tokens)
    assert torch.equal(out.sequences[:, :width], input_ids)
    generated = out.sequences[:, width:]
    return [generated[i :: len(prompts)] for i in range(len(prompts))], out.speculative
