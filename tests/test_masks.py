"""The additive mask written in place equals the visibility matrix turned additive, for every input shape."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_specdec.trees.masks import additive_mask, to_additive, visibility


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(1, 3),
    past=st.integers(0, 6),
    q=st.integers(1, 5),
    per_row=st.booleans(),
    recent_width=st.integers(0, 3),
    extra=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_additive_mask_is_the_visibility_made_additive(batch, past, q, per_row, recent_width, extra, seed) -> None:
    generator = torch.Generator().manual_seed(seed)

    def bools(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator) < 0.6

    past_valid, new_valid = bools(batch, past), bools(batch, q)
    structure = bools(batch, q, q) if per_row else bools(q, q)
    recent = bools(batch, q, min(recent_width, past)) if recent_width else None
    expected = to_additive(visibility(past_valid, new_valid, structure, recent=recent), torch.float32)
    if extra:
        hidden = torch.full((batch, 1, q, extra), torch.finfo(torch.float32).min)
        expected = torch.cat([expected, hidden], dim=-1)
    mask = additive_mask(past_valid, new_valid, structure, torch.float32, recent, past + q + extra)
    assert torch.equal(mask, expected)
