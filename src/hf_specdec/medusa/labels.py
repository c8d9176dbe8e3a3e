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


def base_labels(labels: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
    """Labels that teach the base's own choices: at every labelled position, the base's greedy prediction of
    that token from the data's prefix (its argmax one position earlier) instead of the data's token.

    Teacher-forced self-distillation: the text can be anyone's (a chat corpus), while the labels are what this
    base writes after that prefix, which is what its heads must guess at decoding time. One forward per
    example instead of generating the replies.

    Args:
        labels (`torch.LongTensor` of shape `(batch, seq)`): the data's labels, `IGNORE_INDEX` where none.
        predictions (`torch.LongTensor` of shape `(batch, seq)`): the base's argmax at every position (the
            prediction of the next token).
    """
    relabeled = torch.full_like(labels, IGNORE_INDEX)
    relabeled[:, 1:] = predictions[:, :-1]
    return torch.where(labels == IGNORE_INDEX, IGNORE_INDEX, relabeled)


@torch.no_grad()
def labels_from_base(labels: torch.Tensor, last_states: torch.Tensor, lm_head: torch.nn.Module) -> torch.Tensor:
    """[`base_labels`] from the base's last hidden states `(batch, seq, hidden)` (after its final norm): its
    lm_head runs only one position before each labelled one, the positions whose prediction becomes a label."""
    predicts = torch.zeros_like(labels, dtype=torch.bool)
    predicts[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    states = last_states[predicts].to(lm_head.weight.dtype)
    # In slices of positions: a batch's logits over a large vocabulary at once would take gigabytes.
    chosen = [lm_head(part).argmax(dim=-1) for part in states.split(_POSITIONS_AT_ONCE)]
    predictions = torch.zeros_like(labels)
    predictions[predicts] = torch.cat(chosen) if chosen else predictions[predicts]
    return base_labels(labels, predictions)


_POSITIONS_AT_ONCE = 512
