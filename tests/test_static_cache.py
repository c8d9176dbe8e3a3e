"""`cache_implementation="static"` on every path: greedy identity, a cache that compacts and grows when a step
would overflow it, the model's own generation config asking for it, and a compiled target whose recompilations
stay within the bucketed verification widths."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig

import hf_specdec.generation.run as loop
from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.generation import kv_cache
from tests.tiny_models import ragged_batch, tiny_model, tiny_target

NEW = 30


def _paths(arch: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Every speculative path on one target: (the model that generates, its speculative arguments)."""
    target = tiny_target(arch)
    draft = tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    base = tiny_model(arch, seed=0, sharpen=4.0)
    tied = arch != "gpt2"
    medusa = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, share_lm_head=tied))
    recurrent = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, head_type="recurrent", share_lm_head=tied))
    eagle = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, head_type="eagle", share_lm_head=tied))
    eagle3 = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, head_type="eagle3"))
    return {
        "assistant": (target, {"assistant": draft}),
        "assistant-constant": (target, {"assistant": draft, "num_assistant_tokens_schedule": "constant"}),
        "tree": (target, {"assistant": draft, "tree": 8}),
        "lookup": (target, {"prompt_lookup_num_tokens": 3}),
        "hybrid": (target, {"assistant": draft, "prompt_lookup_num_tokens": 3}),
        "medusa": (medusa, {"medusa": True, "tree": "medium"}),
        "medusa-lookup": (medusa, {"medusa": True, "tree": "medium", "prompt_lookup_num_tokens": 3}),
        "recurrent": (recurrent, {"medusa": True, "tree": "medium"}),
        "eagle": (eagle, {"medusa": True, "tree": 8}),
        "eagle3": (eagle3, {"medusa": True, "tree": 8}),
    }


def _plain(model: Any, ids: torch.Tensor, mask: torch.Tensor, new: int = NEW) -> torch.Tensor:
    base = model.base if isinstance(model, MedusaForCausalLM) else model
    return base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)


class _Recorder:
    """Records the static caches the loop builds (their capacity when built and when done)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.caches: list[kv_cache.CachedSequence] = []
        self.capacities: list[int | None] = []
        recorder = self

        class Recorded(kv_cache.CachedSequence):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                recorder.caches.append(self)
                recorder.capacities.append(self.capacity)

        monkeypatch.setattr(loop, "CachedSequence", Recorded)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_static_cache_keeps_plain_greedy_on_every_path(arch: str, batch: int, monkeypatch) -> None:
    recorder = _Recorder(monkeypatch)
    ids, mask = ragged_batch(batch, seed=batch)
    for name, (model, kwargs) in _paths(arch).items():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            do_sample=False,
            cache_implementation="static",
            **kwargs,
        )
        assert torch.equal(out, _plain(model, ids, mask)), name
        cache = recorder.caches[-1]
        assert cache.capacity is not None and all(
            isinstance(layer, kv_cache.StaticLayer) for layer in cache.cache.layers
        ), name


@pytest.mark.parametrize("path", ["assistant", "tree", "medusa", "eagle", "eagle3"])
def test_a_static_cache_too_small_for_a_step_compacts_then_grows(path: str, monkeypatch) -> None:
    """A cache smaller than the sequences: when a step's nodes would overflow it, the holes (here the prompts'
    left padding) are squeezed out first, then it grows, and the output is still plain greedy's."""
    monkeypatch.setattr(kv_cache, "STATIC_HEADROOM", -NEW // 2)
    monkeypatch.setattr(kv_cache, "STATIC_ROUNDING", 1)
    recorder = _Recorder(monkeypatch)
    model, kwargs = _paths("llama")[path]
    ids, mask = ragged_batch(3, seed=7)
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, cache_implementation="static", **kwargs
    )
    assert torch.equal(out, _plain(model, ids, mask))
    built, cache = recorder.capacities[0], recorder.caches[0]
    assert built == ids.shape[1] + NEW - NEW // 2
    assert cache._compactions >= 1
    assert cache.capacity is not None and cache.capacity > built
    assert cache.cache.layers[0].keys.shape[2] == cache.capacity


def test_the_models_own_generation_config_asking_for_a_static_cache_is_honoured(monkeypatch) -> None:
    recorder = _Recorder(monkeypatch)
    model, kwargs = _paths("qwen2")["assistant"]
    model = copy.deepcopy(model)
    model.generation_config.cache_implementation = "static"
    model.generation_config.max_cache_len = 200
    ids, mask = ragged_batch(2, seed=3)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **kwargs)
    model.generation_config.cache_implementation = None
    assert torch.equal(out, _plain(model, ids, mask))
    assert recorder.capacities == [200]  # `max_cache_len`, when larger than what this call needs


def test_calls_with_other_prompts_share_one_cache_size(monkeypatch) -> None:
    """A compiled forward sees the cache's size: a model's later calls keep the size of its largest so far
    (rounded up), as plain `generate()` keeps its static cache's, so that they compile nothing more."""
    recorder = _Recorder(monkeypatch)
    model, kwargs = _paths("llama")["assistant"]
    for batch, new in [(1, 100), (2, 10), (1, 30)]:
        ids, mask = ragged_batch(batch, seed=batch)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            do_sample=False,
            cache_implementation="static",
            **kwargs,
        )
        assert torch.equal(out, _plain(model, ids, mask, new=new))
    target_capacities = recorder.capacities  # the target's caches (the draft's are made by the drafter)
    assert target_capacities == [256, 256, 256]  # 10 + 100 + 64 slots, rounded up to a multiple of 128


@pytest.mark.parametrize("implementation", ["offloaded", "offloaded_static"])
def test_caches_that_cannot_roll_back_exactly_are_refused(implementation: str) -> None:
    model, kwargs = _paths("llama")["assistant"]
    ids, mask = ragged_batch(1)
    with pytest.raises(ValueError, match=f"cache_implementation='{implementation}'.*'static'"):
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, cache_implementation=implementation, **kwargs
        )


@pytest.mark.parametrize("path", ["assistant", "tree", "medusa"])
def test_a_compiled_target_keeps_plain_greedy_and_compiles_one_graph_per_width_bucket(path: str, monkeypatch) -> None:
    """A static cache with a `compile_config` that asks for every device (CPU included) runs the verification
    forward compiled, as plain `generate()` compiles its steps, and a draft model's forwards too. Over 256 new
    tokens the widths fed change from step to step, padded to a few buckets: the graphs compiled are at most one
    per model and width bucket used."""
    shapes: set[tuple[int, int]] = set()
    compiled_calls = [0]
    forward = kv_cache.CachedSequence.forward

    def recorded(self: kv_cache.CachedSequence, input_ids: Any, new_valid: torch.Tensor, *args: Any, **kwargs: Any):
        if self.compiled and self.num_slots:
            shapes.add((id(self.model), kv_cache.bucket(new_valid.shape[1])))
            compiled_calls[0] += 1
        return forward(self, input_ids, new_valid, *args, **kwargs)

    monkeypatch.setattr(kv_cache.CachedSequence, "forward", recorded)
    model, kwargs = _paths("llama")[path]
    model = copy.deepcopy(model)
    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on accelerators only, unless told so
    ids, mask = ragged_batch(1, seed=11)
    torch._dynamo.reset()  # graphs compiled for an earlier model of the same shapes would be reused
    counters.clear()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=256,
        do_sample=False,
        cache_implementation="static",
        compile_config=compile_config,
        **kwargs,
    )
    graphs = counters["stats"]["unique_graphs"]
    assert torch.equal(out, _plain(model, ids, mask, new=256))
    assert compiled_calls[0] > 40  # the compiled forwards ran at (almost) every step
    if path != "medusa":  # the draft model's forwards are compiled too
        assert len({model_id for model_id, _ in shapes}) == 2
    assert 1 <= graphs <= len(shapes), (graphs, sorted(shapes))


def test_widths_are_bucketed_to_powers_of_two_and_their_midpoints() -> None:
    widths = range(1, 200)
    buckets = [kv_cache.bucket(w) for w in widths]
    assert sorted(set(buckets)) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert all(w <= b < 1.5 * w + 1 for w, b in zip(widths, buckets, strict=True))  # never pads by half or more
    assert all(kv_cache.bucket(b) == b for b in buckets)
