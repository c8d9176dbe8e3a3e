"""What goes beyond the refusal table (docs/refusals.md, checked by tests/test_refusal_table.py): where plain
`generate()` itself fails on an input, the speculative paths fail exactly as it does; and the inputs next to a
refusal that are not refused decode as plain `generate()` decodes them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from hf_specdec import MedusaConfig, MedusaForCausalLM
from tests.refusal_cases import (
    DRAFT_PATHS,
    PATHS,
    Models,
    mistral,
    one_layer_mistral,
    prompts,
    speculative_generate,
)
from tests.tiny_models import VOCAB, ragged_batch, tiny_model


@pytest.fixture(scope="module")
def models() -> Models:
    return Models()


def _fails_as_plain(models: Models, path: str, **call: Any) -> None:
    """The call on `path` raises what plain `generate()` raises for it: the same type, the same message."""
    with pytest.raises(Exception) as plain:  # whatever plain generate() raises
        models.target.generate(**call)
    with pytest.raises(type(plain.value)) as ours:
        models.generate(path)(**call)
    assert str(ours.value) == str(plain.value)


@pytest.mark.parametrize("path", PATHS)
def test_empty_prompts_of_several_rows_fail_as_in_plain_generate(models: Models, path: str) -> None:
    # transformers' own generate() fails first (its right-padding check reads the last column), as in plain decoding;
    # one empty row reaches the speculative loop, which refuses it (docs/refusals.md).
    empty = {"input_ids": torch.zeros(2, 0, dtype=torch.long), "attention_mask": torch.zeros(2, 0, dtype=torch.long)}
    _fails_as_plain(models, path, **empty, max_new_tokens=4)


@pytest.mark.parametrize("path", PATHS)
def test_max_new_tokens_zero_is_refused_as_plain_generate_refuses_it(models: Models, path: str) -> None:
    _fails_as_plain(models, path, **prompts(max_new_tokens=0))


@pytest.mark.parametrize("path", PATHS)
def test_int32_input_ids_decode_as_in_plain_generate(models: Models, path: str) -> None:
    ids, mask = ragged_batch(2)
    plain = models.target.generate(**prompts(input_ids=ids.int(), attention_mask=mask))
    ours = models.generate(path)(**prompts(input_ids=ids.int(), attention_mask=mask))
    assert ours.dtype == plain.dtype == torch.long and torch.equal(ours, plain)


@pytest.mark.parametrize("path", PATHS)
def test_left_padding_on_a_sliding_window_model_decodes_as_plain_generate(path: str) -> None:
    """Padding inside a prompt is refused on a sliding-window model; left padding decodes as in plain decoding."""
    target = mistral()
    plain = target.generate(**prompts(max_new_tokens=8))
    assert torch.equal(speculative_generate(path, target, one_layer_mistral())(**prompts(max_new_tokens=8)), plain)


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_a_draft_in_another_dtype_drafts_and_the_target_decides(models: Models, path: str) -> None:
    draft = copy.deepcopy(models.draft).to(torch.bfloat16)
    plain = models.target.generate(**prompts(max_new_tokens=12))
    assert torch.equal(speculative_generate(path, models.target, draft)(**prompts(max_new_tokens=12)), plain)


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_a_copy_of_the_target_with_equal_weights_is_another_model(models: Models, path: str) -> None:
    """The target itself as its draft is refused; a separate copy with equal weights drafts (and exactly)."""
    twin = speculative_generate(path, models.target, copy.deepcopy(models.target))(**prompts())
    assert torch.equal(twin, models.target.generate(**prompts()))


def test_positional_generation_config_alone_is_taken(models: Models) -> None:
    """Arguments after `generation_config` must be keywords; the inputs and the config by position are fine."""
    ids, mask = ragged_batch(2)
    config = GenerationConfig(max_new_tokens=4, do_sample=False)
    plain = models.target.generate(ids, config, attention_mask=mask)
    assert torch.equal(models.generate("assistant")(ids, config, attention_mask=mask), plain)


def test_medusa_heads_for_another_base(tmp_path: Path) -> None:
    """Loaded onto a base of other sizes, heads are refused (by `from_pretrained` as by the constructor); onto
    another base of the same sizes, they load."""
    base = tiny_model("llama", seed=0)
    MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2)).save_pretrained(tmp_path)
    narrower = LlamaForCausalLM(LlamaConfig(**{**base.config.to_dict(), "hidden_size": 32})).eval()
    wider_vocab = LlamaForCausalLM(LlamaConfig(**{**base.config.to_dict(), "vocab_size": VOCAB + 32})).eval()
    for other, sizes in ((narrower, "hidden size 32 and 96 logits"), (wider_vocab, "hidden size 64 and 128 logits")):
        message = rf"made for hidden size 64 and 96 logits, but the base has {sizes}: they belong to another base"
        with pytest.raises(ValueError, match=message):
            MedusaForCausalLM.from_pretrained(tmp_path, base_model=other)
        with pytest.raises(ValueError, match=message):
            MedusaForCausalLM(other, MedusaConfig(num_heads=2, hidden_size=64, vocab_size=VOCAB))
    assert MedusaForCausalLM.from_pretrained(tmp_path, base_model=tiny_model("qwen2", seed=3)).heads is not None
