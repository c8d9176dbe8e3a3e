"""On a CUDA device (`hf-specdec gpu --tests` runs these; skipped without one): greedy identity on every path,
eager and compiled with CUDA graphs; synchronisations per step bounded, counted by CUDA itself; steps timed
with CUDA events."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import CompileConfig

from hf_specdec import SpeculativeCosts
from hf_specdec.medusa import MedusaForCausalLM
from tests.test_static_cache import _paths
from tests.tiny_models import ragged_batch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: hf-specdec gpu --tests"),
]
PATHS = ["assistant", "assistant-constant", "tree", "lookup", "hybrid", "medusa", "medusa-lookup", "eagle", "eagle3"]
NEW = 40


def _on_cuda(path: str, arch: str = "llama"):
    model, kwargs = _paths(arch)[path]
    model = model.to("cuda")
    if "assistant" in kwargs:
        kwargs = {**kwargs, "assistant": kwargs["assistant"].to("cuda")}
    return model, kwargs


def _plain(model, ids, mask, new: int = NEW):
    base = model.base if isinstance(model, MedusaForCausalLM) else model
    return base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_every_path_keeps_plain_greedy_on_cuda(path: str, compiled: bool) -> None:
    model, kwargs = _on_cuda(path)
    ids, mask = (t.to("cuda") for t in ragged_batch(3, seed=5))
    extra = {}
    if compiled:  # transformers' default: mode="reduce-overhead", CUDA graphs
        torch._dynamo.reset()
        extra = {"cache_implementation": "static", "compile_config": CompileConfig()}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **kwargs, **extra)
    assert out.device.type == "cuda"
    assert torch.equal(out, _plain(model, ids, mask))


@pytest.mark.parametrize("path", ["assistant-constant", "lookup", "medusa", "tree", "eagle3"])
def test_synchronisations_per_step_are_bounded_as_cuda_counts_them(path: str) -> None:
    """CUDA's own sync debug mode warns at every operation that makes the host wait for the device: a step with a
    constant draft length waits at most twice (its one read, and what the first step allocates)."""
    model, kwargs = _on_cuda(path)
    ids, mask = (t.to("cuda") for t in ragged_batch(1, seed=6))
    call = dict(input_ids=ids, attention_mask=mask, max_new_tokens=64, do_sample=False, return_dict_in_generate=True)
    call |= {**kwargs, "speculative_costs": SpeculativeCosts(0.0, 0.0)}
    model.generate(**call)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model.generate(**call)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchronizing" in str(w.message).lower())
    syncs = sites.total()
    steps = int(out.speculative.target_forwards.max()) + 1
    assert syncs <= 2 * steps + 16, (syncs, steps, sites.most_common(12))


def test_steps_are_timed_with_cuda_events() -> None:
    model, kwargs = _on_cuda("assistant")
    ids, mask = (t.to("cuda") for t in ragged_batch(1, seed=7))
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, **kwargs
    )
    assert out.speculative.verify_seconds > 0 and out.speculative.draft_seconds > 0
