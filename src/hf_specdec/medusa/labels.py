"""How labels line up with the tokens they label, for the heads and their training loss alike.

`IGNORE_INDEX` marks a position without a label (a prompt token, padding), as transformers' labels do; and
[`values_after`] reads, at every position, the entries that follow it: the tokens recurrent heads are fed, and
the labels a head at each depth trains on. Model code takes these from here, so that it never imports the
training loss (`hf_specdec.medusa.loss`), which builds on them.
"""

from __future__ import annotations

import torch
from torch.nn import functional

IGNORE_INDEX = -100


def values_after(values: torch.Tensor, width: int, fill: int | bool) -> torch.Tensor:
    """`(batch, seq, width)`: at every position t of `values` `(batch, seq)`, the entries t + 1 .. t + width
    (`fill` past the end). A view of a padded copy, not `width` copies."""
    return functional.pad(values, (0, width + 1), value=fill).unfold(1, width, 1)[:, 1 : values.shape[1] + 1]
