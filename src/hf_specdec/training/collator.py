"""Pad a batch of tokenised examples (and cached hidden states) to a rectangle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hf_specdec.medusa.loss import IGNORE_INDEX


@dataclass
class MedusaCollator:
    """Right-pads `input_ids` (with `pad_token_id`), `labels` (with `IGNORE_INDEX`), `attention_mask`, and
    `hidden_states` `(seq, hidden)` when examples carry cached base hidden states."""

    pad_token_id: int

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = max(len(e["labels"]) for e in examples)
        batch: dict[str, torch.Tensor] = {}
        batch["labels"] = _pad([torch.as_tensor(e["labels"]) for e in examples], length, IGNORE_INDEX)
        if "input_ids" in examples[0]:
            ids = [torch.as_tensor(e["input_ids"]) for e in examples]
            batch["input_ids"] = _pad(ids, length, self.pad_token_id)
            batch["attention_mask"] = _pad([torch.ones_like(i) for i in ids], length, 0)
        if "hidden_states" in examples[0]:
            states = [torch.as_tensor(e["hidden_states"]) for e in examples]
            batch["hidden_states"] = torch.stack(
                [torch.nn.functional.pad(s, (0, 0, 0, length - s.shape[0])) for s in states]
            )
        return batch


def _pad(rows: list[torch.Tensor], length: int, value: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, length - r.shape[0]), value=value) for r in rows])
