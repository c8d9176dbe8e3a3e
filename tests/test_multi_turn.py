"""Continuing a conversation from a cache (`cache=`, `past_key_values=`) on every speculative path: the same tokens
as plain `generate()` at every turn, and the cache left as plain decoding leaves it, whichever call filled it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer

import hf_specdec
from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.generation.decisions import SpeculativeCosts
from tests.test_eagle import _eagle
from tests.test_eagle3 import _eagle3
from tests.test_mtp import tiny_mtp_model
from tests.tiny_models import PAD, VOCAB, ragged_batch, tiny_model

NEW = 10


def _first_turn(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    if batch == 1:
        return torch.tensor([[5, 17, 33, 8, 61, 12, 40, 9, 22]]), torch.ones(1, 9, dtype=torch.long)
    return ragged_batch(batch)


def _conversation(generate: Callable[..., Any], batch: int, cache: Any, turns: int = 3) -> list[torch.Tensor]:
    """`turns` turns, each adding a user message of 4 tokens to the last output and continuing from `cache`."""
    ids, mask = _first_turn(batch)
    outputs = []
    for turn in range(turns):
        out = generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, cache=cache)
        outputs.append(out)
        message = torch.full((batch, 4), 7 + turn)
        ids = torch.cat([out, message], dim=1)
        mask = torch.cat([mask, mask.new_ones(batch, ids.shape[1] - mask.shape[1])], dim=1)
    return outputs


def _same_cache(plain: Any, ours: Any, mask: torch.Tensor | None = None) -> None:
    assert ours.get_seq_length() == plain.get_seq_length()
    for mine, theirs in zip(ours.layers, plain.layers, strict=True):
        assert mine.keys.shape == theirs.keys.shape
        if mask is None:
            mask = torch.ones(mine.keys.shape[0], plain.get_seq_length(), dtype=torch.long)
        real = mask.bool()[:, None, -mine.keys.shape[2] :, None]  # a sliding-window layer keeps the last slots
        torch.testing.assert_close(
            torch.where(real, mine.keys, 0), torch.where(real, theirs.keys, 0), atol=1e-5, rtol=1e-4
        )


PATHS = {
    "assistant": lambda draft: {"assistant": draft},
    "assistant-model": lambda draft: {"assistant_model": draft},
    "tree": lambda draft: {"assistant": draft, "tree": 4},
    "lookup": lambda draft: {"prompt_lookup_num_tokens": 3},
    "hybrid": lambda draft: {"assistant": draft, "prompt_lookup_num_tokens": 3},
    "early-exit": lambda draft: {"assistant_early_exit": 1},
}


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mistral"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_conversation_is_plain_at_every_turn(arch: str, batch: int, path: str) -> None:
    target, draft = tiny_model(arch, seed=0, sharpen=4.0), tiny_model(arch, seed=1, num_layers=1)
    plain_cache = DynamicCache(config=target.config)
    plain = _conversation(target.generate, batch, plain_cache)
    cache = DynamicCache(config=target.config)
    extra = PATHS[path](draft)
    ours = _conversation(lambda **kw: hf_specdec.speculative_generate(target, **kw, **extra), batch, cache)
    for mine, theirs in zip(ours, plain, strict=True):
        assert torch.equal(mine, theirs)
    final_mask = (torch.arange(plain_cache.get_seq_length()) >= 0)[None].expand(batch, -1)
    if batch > 1:  # padding slots hold whatever their (masked) forward wrote
        final_mask = torch.cat([_first_turn(batch)[1], final_mask[:, _first_turn(batch)[1].shape[1] :]], dim=1)
    _same_cache(plain_cache, cache, final_mask)


def test_turns_alternate_between_plain_and_speculative_calls() -> None:
    target, draft = tiny_model("qwen2", seed=0, sharpen=4.0), tiny_model("qwen2", seed=1, num_layers=1)
    plain = _conversation(target.generate, 1, DynamicCache(config=target.config), turns=4)
    calls = iter([{}, {"assistant": draft}, {}, {"prompt_lookup_num_tokens": 3}])

    def generate(**kwargs: Any) -> torch.Tensor:
        return hf_specdec.speculative_generate(target, **kwargs, **next(calls))

    ours = _conversation(generate, 1, DynamicCache(config=target.config), turns=4)
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))


def test_the_output_cache_continues_the_conversation_under_its_former_name() -> None:
    target, draft = hf_specdec.speculative(tiny_model("llama", seed=0, sharpen=4.0)), tiny_model("llama", 1, 1)
    ids, _ = _first_turn(1)
    call = {"max_new_tokens": NEW, "do_sample": False, "return_dict_in_generate": True}
    plain = target.generate(input_ids=ids, **call)
    first = target.generate(input_ids=ids, assistant=draft, **call)
    assert torch.equal(first.sequences, plain.sequences)
    _same_cache(plain.cache, first.cache)
    follow = torch.cat([first.sequences, torch.tensor([[7, 8, 9]])], dim=1)
    expected = target.generate(input_ids=follow, max_new_tokens=NEW, do_sample=False, cache=plain.cache)
    with pytest.warns(FutureWarning, match="past_key_values"):
        out = target.generate(
            input_ids=follow, max_new_tokens=NEW, do_sample=False, past_key_values=first.cache, assistant=draft
        )
    assert torch.equal(out, expected)


def test_a_static_cache_is_continued() -> None:
    target, draft = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, num_layers=1)
    plain = _conversation(target.generate, 1, StaticCache(config=target.config, max_cache_len=128))
    cache = StaticCache(config=target.config, max_cache_len=128)
    ours = _conversation(lambda **kw: hf_specdec.speculative_generate(target, **kw, assistant=draft), 1, cache)
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))


def test_a_static_sliding_window_cache_is_continued_within_its_window_and_refused_past_it() -> None:
    target, draft = tiny_model("mistral", seed=0, sharpen=4.0), tiny_model("mistral", seed=1, num_layers=1)
    ids = torch.tensor([[5, 17, 33, 8]])
    call = {"max_new_tokens": 4, "do_sample": False}
    caches = [StaticCache(config=target.config, max_cache_len=128) for _ in range(2)]
    first = [target.generate(input_ids=ids, cache=caches[0], **call)]
    first.append(hf_specdec.speculative_generate(target, input_ids=ids, cache=caches[1], assistant=draft, **call))
    assert torch.equal(*first)
    follow = torch.cat([first[0], torch.tensor([[7, 8]])], dim=1)  # 10 tokens: within the window of 12
    expected = target.generate(input_ids=follow, cache=caches[0], **call)
    assert torch.equal(
        hf_specdec.speculative_generate(target, input_ids=follow, cache=caches[1], assistant=draft, **call), expected
    )
    longer = torch.cat([expected, torch.tensor([[7, 8, 9]])], dim=1)  # the cache now holds 13 tokens
    with pytest.raises(ValueError, match="wrapped around"):
        hf_specdec.speculative_generate(target, input_ids=longer, cache=caches[1], assistant=draft, **call)


def test_rows_that_stop_early_leave_the_cache_plain_leaves() -> None:
    target, draft = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, num_layers=1)
    ids, mask = _first_turn(3)
    ends = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    call = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 30, "do_sample": False}
    eos = {"eos_token_id": int(ends[0, ids.shape[1] + 2])}  # row 0 stops after 3 tokens, the others later
    plain_cache, cache = DynamicCache(config=target.config), DynamicCache(config=target.config)
    plain = target.generate(**call, **eos, cache=plain_cache)
    ours = hf_specdec.speculative_generate(target, **call, **eos, cache=cache, assistant=draft)
    assert torch.equal(ours, plain)
    assert plain[0, -1] == PAD and plain.shape[1] > ids.shape[1] + 3  # row 0 stopped early, padded since
    full = torch.cat([mask, mask.new_ones(3, plain_cache.get_seq_length() - mask.shape[1])], dim=1)
    _same_cache(plain_cache, cache, full)


def test_medusa_heads_continue_a_conversation() -> None:
    base = tiny_model("llama", seed=0, sharpen=4.0)
    heads = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2))
    plain = _conversation(base.generate, 1, DynamicCache(config=base.config))
    ours = _conversation(lambda **kw: heads.generate(**kw, medusa=True), 1, DynamicCache(config=base.config))
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))


# Drafters that read the target's hidden states: continuing a cache, their context starts at the new turn.
FREE = SpeculativeCosts(0.0, 0.0)  # every step drafts, whatever the clock says
HIDDEN_STATE_PATHS = {
    "eagle": lambda: (_eagle("llama"), {"medusa": True}),
    "eagle-lookup": lambda: (_eagle("llama"), {"medusa": True, "prompt_lookup_num_tokens": 3}),
    "eagle3": lambda: (_eagle3("qwen2"), {"medusa": True}),
    "mtp-chain": lambda: (tiny_mtp_model("glm4_moe", 2, VOCAB, seed=3), {"use_mtp": True}),
    "mtp-tree": lambda: (tiny_mtp_model("deepseek_v3", 1, VOCAB, seed=3), {"use_mtp": True, "tree": 6}),
}


def _hidden_state_generate(path: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Plain `generate()` of the path's target, and the path's speculative `generate()`."""
    model, extra = HIDDEN_STATE_PATHS[path]()
    if isinstance(model, MedusaForCausalLM):
        return model.base.generate, lambda **kw: model.generate(**kw, **extra, speculative_costs=FREE)
    return model.generate, lambda **kw: hf_specdec.speculative_generate(model, **kw, **extra, speculative_costs=FREE)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", sorted(HIDDEN_STATE_PATHS))
def test_drafters_reading_hidden_states_continue_a_conversation(path: str, batch: int) -> None:
    plain_generate, generate = _hidden_state_generate(path)
    plain = _conversation(plain_generate, batch, DynamicCache())
    ours = _conversation(generate, batch, DynamicCache())
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", sorted(HIDDEN_STATE_PATHS))
def test_drafters_reading_hidden_states_continue_a_plain_first_turn(path: str, batch: int) -> None:
    plain_generate, generate = _hidden_state_generate(path)
    plain = _conversation(plain_generate, batch, DynamicCache())
    calls = iter([plain_generate, generate, generate])
    ours = _conversation(lambda **kw: next(calls)(**kw), batch, DynamicCache())
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))


def test_refusals() -> None:
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1, num_layers=1)
    ids, _ = _first_turn(1)
    cache = DynamicCache(config=target.config)
    target.generate(input_ids=ids, max_new_tokens=2, cache=cache)
    with pytest.raises(ValueError, match="at least one token the cache does not hold"):
        hf_specdec.speculative_generate(target, input_ids=ids[:, :5], cache=cache, assistant=draft)
    with pytest.raises(ValueError, match="pass it once"):
        hf_specdec.speculative_generate(target, input_ids=ids, cache=cache, past_key_values=cache, assistant=draft)
    with pytest.raises(ValueError, match="holds 1 rows but `input_ids` has 2"):
        hf_specdec.speculative_generate(
            target, input_ids=torch.cat([ids, ids]).repeat(1, 2), cache=cache, assistant=draft, max_new_tokens=2
        )

    class Quantised(DynamicLayer):  # a layer keeping its slots elsewhere, as transformers' quantised layers do
        pass

    other = DynamicCache(config=target.config)
    other.layers = [Quantised() for _ in other.layers]
    with pytest.raises(ValueError, match=r"cache of \['Quantised'\] layers cannot be continued"):
        hf_specdec.speculative_generate(target, input_ids=ids, cache=other, assistant=draft, max_new_tokens=2)
