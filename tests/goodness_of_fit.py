"""Chi-square goodness of fit for sampled token sequences, shared by the statistical tests."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare


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
