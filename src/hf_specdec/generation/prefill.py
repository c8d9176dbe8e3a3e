"""A draft's prefill over a left-padded batch without computing most of its padding.

Prompts of a batch are left-padded to the longest, and one forward over them computes every padding slot. A
target pays this as plain `generate()` does; a draft model would pay it on top, once per call, at batch sizes
where that fixed cost decides whether drafting pays at all (Qwen2.5-Coder-0.5B on a 2-core CPU: 2.5 s over
four prompts of 47 to 267 tokens, as much as twelve plain decoding steps of the 1.5B target). `prefill_by_span`
runs rows of similar spans together (a span: from a row's first real token to the end) and assembles the cache
the padded forward would have built: each row's slots in the same columns, padding slots zero and marked
invalid. Only a draft's prefill is run this way: the numbers it computes differ from a padded forward's by
rounding, which changes what it proposes at most, never what is accepted (a target prefilled this way would part
from plain greedy at float32 near-ties).
"""

from __future__ import annotations

import torch

from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.trees.masks import chain_structure

# Padding share a group of rows may compute: on a CPU a forward costs in proportion to its tokens, so rows run
# alone; on an accelerator each forward has a fixed cost, so rows whose spans differ by less share one.
MOST_WASTE = {"cpu": 0.0}
ACCELERATOR_WASTE = 0.25


def span_groups(spans: list[int], most_waste: float) -> list[list[int]]:
    """Rows grouped for prefilling, longest spans first: a row joins the group before it while the group's padding
    stays within `most_waste` of its slots."""
    groups: list[list[int]] = []
    for row in sorted(range(len(spans)), key=lambda b: -spans[b]):
        if groups:
            group = groups[-1]
            slots = (len(group) + 1) * spans[group[0]]
            real = sum(spans[b] for b in group) + spans[row]
            if slots - real <= most_waste * slots:
                group.append(row)
                continue
        groups.append([row])
    return groups


def prefill_by_span(seq: CachedSequence, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
    """Feed `seq` (empty, dynamic cache) the left-padded prompts `(batch, width)`, rows grouped by span
    (`span_groups`); the cache, validity and positions end as one forward over the whole batch leaves them.
    Reads the spans from the device once."""
    batch, width = input_ids.shape
    device = input_ids.device
    if batch == 1 or seq.recurrent is not None:  # a recurrent state is one per row: no slots to assemble
        seq.forward(input_ids, valid, positions, chain_structure(width, device), logits_to_keep=1)
        return
    spans = (width - valid.int().argmax(dim=1)).tolist()  # no row is all padding (`check_prompts`)
    groups = span_groups(spans, MOST_WASTE.get(device.type, ACCELERATOR_WASTE))
    if len(groups) == 1:  # one forward computes about as much: the padded one
        seq.forward(input_ids, valid, positions, chain_structure(width, device), logits_to_keep=1)
        return
    layers: list[tuple[torch.Tensor, torch.Tensor]] = []
    for group in groups:
        span = spans[group[0]]
        rows = torch.tensor(group).to(device, non_blocking=True)
        part = CachedSequence(seq.model, len(group), device)
        columns = slice(width - span, width)
        part.forward(
            input_ids[rows, columns], valid[rows, columns], positions[rows, columns],
            chain_structure(span, device), logits_to_keep=1,
        )  # fmt: skip
        for index, layer in enumerate(part.cache.layers):
            keys, values = layer.keys, layer.values  # (group, heads, span, head_dim)
            if index == len(layers):
                shape = (batch, keys.shape[1], width, keys.shape[3])
                layers.append((keys.new_zeros(shape), values.new_zeros((*shape[:3], values.shape[3]))))
            layers[index][0][rows, :, columns] = keys
            layers[index][1][rows, :, columns] = values
    seq.start_from(layers, valid, positions)
