"""A streamer sees what plain `generate()` shows it, on every path and at any batch size: the prompts, then one
`(batch,)` tensor per position (the pad token for rows that have finished), then `end()`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hf_specdec
from tests.callback_cases import PATHS, Recording, models
from tests.tiny_models import ragged_batch


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_streamer_sees_plains_calls(path: str, batch: int) -> None:
    target, draft, heads = models()
    ids, mask = ragged_batch(3, seed=4)
    ids, mask = ids[:batch], mask[:batch]
    settings: dict[str, Any] = {"attention_mask": mask, "max_new_tokens": 12, "do_sample": False}
    first = target.generate(ids, **settings)
    generated = first[0, ids.shape[1] :].tolist()
    fresh = [t for j, t in enumerate(generated) if j >= 3 and t not in generated[:j]]
    settings["eos_token_id"] = fresh[0] if fresh else None  # row 0 stops after 4+ tokens, the others later or never
    plain = Recording()
    expected = target.generate(ids, streamer=plain, **settings)
    model = heads if path == "heads" else target
    streamed = Recording()
    extra = {"speculative_costs": hf_specdec.SpeculativeCosts(0.0, 0.0), **PATHS[path](draft)}
    out = model.generate(ids, streamer=streamed, **settings, **extra)
    assert torch.equal(out, expected)
    assert streamed.calls == plain.calls
    assert len(plain.calls) > 3
