"""A draft's prefill by span: rows of different lengths computed without most of their padding, into the cache one
padded forward would have built."""

from __future__ import annotations

import pytest
import torch

from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.generation.prefill import prefill_by_span, span_groups
from hf_specdec.generation.run import prompt_positions
from hf_specdec.trees.masks import chain_structure
from tests.tiny_models import ragged_batch, tiny_model


def test_rows_share_a_forward_only_while_their_padding_stays_within_the_waste_allowed() -> None:
    spans = [47, 267, 121, 238]
    assert span_groups(spans, 0.0) == [[1], [3], [2], [0]]
    assert span_groups(spans, 0.25) == [[1, 3, 2], [0]]  # 801 slots for 626 real tokens; 47 would waste 37%
    assert span_groups([5, 5, 5], 0.0) == [[0, 1, 2]]  # equal spans waste nothing


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_the_cache_and_the_next_forward_are_the_padded_forwards(arch: str) -> None:
    model = tiny_model(arch, seed=0)
    ids, mask = ragged_batch(4, seed=3, prompt=16)
    ids[2, 6] = 0
    mask[2, 6] = 0  # padding inside a prompt too (not for a sliding window, which refuses it)
    if arch == "mistral":
        mask[2, 6], ids[2, 6] = 1, 7
    valid, positions = mask.bool(), prompt_positions(mask)
    padded, by_span = CachedSequence(model, 4, ids.device), CachedSequence(model, 4, ids.device)
    padded.forward(ids, valid, positions, chain_structure(16, ids.device), logits_to_keep=1)
    fed: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: fed.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    prefill_by_span(by_span, ids, valid, positions)
    hook.remove()
    assert sum(fed) == int((16 - valid.int().argmax(dim=1)).sum()) < ids.numel()  # each row's span alone
    assert torch.equal(by_span.valid, padded.valid) and by_span.num_slots == padded.num_slots
    for ours, theirs in zip(by_span.cache.layers, padded.cache.layers, strict=True):
        seen = valid[:, None, :, None].expand_as(theirs.keys)
        torch.testing.assert_close(ours.keys[seen], theirs.keys[seen], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.values[seen], theirs.values[seen], rtol=1e-4, atol=1e-5)
    new = torch.randint(4, 96, (4, 3))
    new_positions = positions[:, -1:] + 1 + torch.arange(3)
    after = [seq.forward(new, None, new_positions, chain_structure(3, ids.device)).logits for seq in (by_span, padded)]
    torch.testing.assert_close(after[0], after[1], rtol=1e-4, atol=1e-4)


def test_a_started_cache_refuses_states_from_elsewhere() -> None:
    model = tiny_model("llama", seed=0)
    ids, mask = ragged_batch(2, seed=3)
    seq = CachedSequence(model, 2, ids.device)
    seq.forward(ids, mask.bool(), prompt_positions(mask), chain_structure(ids.shape[1], ids.device))
    with pytest.raises(ValueError, match="empty dynamic cache"):
        seq.start_from([], mask.bool(), prompt_positions(mask))
