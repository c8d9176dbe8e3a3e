"""The bad input table (docs/usage.md, "What is refused, and why"): every row on every speculative path it applies
to gets a `ValueError` / `TypeError` of our own that names the problem, never an error from deep inside torch or
a silent result. Where plain `generate()` already refuses the same input itself (empty batched prompts,
`max_new_tokens=0`), the speculative paths refuse it exactly as plain does."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    PreTrainedModel,
    RwkvConfig,
    RwkvForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM
from tests.tiny_models import BOS, EOS, PAD, VOCAB, ragged_batch, tiny_model, tiny_target

PATHS = ["assistant", "lookup", "hybrid", "medusa", "medusa-dynamic", "medusa-lookup"]
DRAFT_PATHS = ["assistant", "hybrid"]


def _speculative(path: str, target: PreTrainedModel, draft: PreTrainedModel | None = None) -> Callable[..., Any]:
    """`generate` on `path`: `target` with speculative generate() and `draft` for the draft-model paths; for
    the Medusa paths fresh heads on `target`."""
    if path.startswith("medusa"):
        medusa = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2))
        extra: dict[str, Any] = {
            "medusa": {},
            "medusa-dynamic": {"tree": DynamicTree(num_nodes=3)},
            "medusa-lookup": {"prompt_lookup_num_tokens": 3},
        }[path]
        return lambda **kwargs: medusa.generate(medusa=True, **extra, **kwargs)
    target = hf_specdec.speculative(target)
    extra = {
        "assistant": {"assistant": draft},
        "lookup": {"prompt_lookup_num_tokens": 3},
        "hybrid": {"assistant": draft, "prompt_lookup_num_tokens": 3},
    }[path]
    return lambda **kwargs: target.generate(**extra, **kwargs)


@pytest.fixture(scope="module")
def models() -> dict[str, PreTrainedModel]:
    return {"target": tiny_target("llama"), "draft": tiny_model("llama", seed=1, num_layers=1)}


@pytest.fixture(scope="module")
def generate(models) -> Callable[[str], Callable[..., Any]]:
    """The `generate` of each path, built once per module."""
    made: dict[str, Callable[..., Any]] = {}

    def get(path: str) -> Callable[..., Any]:
        if path not in made:
            made[path] = _speculative(path, models["target"], models["draft"])
        return made[path]

    return get


def _prompts(**kwargs: Any) -> dict[str, Any]:
    ids, mask = ragged_batch(2)
    return {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 4, "do_sample": False, **kwargs}


# Rows 1-6: the prompts and lengths -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_1_empty_prompts(generate, models, path: str) -> None:
    # One row: transformers hands the empty prompt to our loop (plain decoding fails in the model's reshape).
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(1, 0\): the prompts are empty"):
        generate(path)(input_ids=torch.zeros(1, 0, dtype=torch.long), max_new_tokens=4)
    # Several rows: transformers' own generate() fails first (its right-padding check reads the last column),
    # exactly as in plain decoding.
    empty = {"input_ids": torch.zeros(2, 0, dtype=torch.long), "attention_mask": torch.zeros(2, 0, dtype=torch.long)}
    with pytest.raises(IndexError, match="index -1 is out of bounds") as plain:
        models["draft"].generate(**empty, max_new_tokens=4)
    with pytest.raises(IndexError, match="index -1 is out of bounds") as ours:
        generate(path)(**empty, max_new_tokens=4)
    assert str(ours.value) == str(plain.value)


@pytest.mark.parametrize("path", PATHS)
def test_2_a_row_that_is_all_padding(generate, path: str) -> None:
    ids, mask = ragged_batch(3)
    mask[1] = 0
    with pytest.raises(ValueError, match=r"Row\(s\) \[1\] of `attention_mask` are all zeros"):
        generate(path)(**_prompts(input_ids=ids, attention_mask=mask))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad_id", [VOCAB, VOCAB + 1000, -1])
def test_3_ids_outside_the_vocabulary(generate, path: str, bad_id: int) -> None:
    ids, mask = ragged_batch(2)
    ids[1, 7] = bad_id
    with pytest.raises(ValueError, match=rf"holds id {bad_id} \(row 1, position 7\), outside the {VOCAB} ids"):
        generate(path)(**_prompts(input_ids=ids, attention_mask=mask))


def test_3_ids_outside_the_vocabulary_under_padding(generate) -> None:
    ids, mask = ragged_batch(2)
    ids[1, 0] = -100  # a label-style filler under the padding is embedded all the same
    with pytest.raises(ValueError, match=r"holds id -100 \(row 1, position 0, under padding\).*pad_token_id"):
        generate("lookup")(**_prompts(input_ids=ids, attention_mask=mask))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_4_input_ids_that_are_not_integers(generate, path: str, dtype: torch.dtype) -> None:
    ids, mask = ragged_batch(2)
    with pytest.raises(TypeError, match=rf"`input_ids` must hold integer token ids, got {dtype}"):
        generate(path)(**_prompts(input_ids=ids.to(dtype), attention_mask=mask))


@pytest.mark.parametrize("path", PATHS)
def test_4_int32_input_ids_decode_as_in_plain_generate(generate, models, path: str) -> None:
    ids, mask = ragged_batch(2)
    plain = models["target"].generate(**_prompts(input_ids=ids.int(), attention_mask=mask))
    ours = generate(path)(**_prompts(input_ids=ids.int(), attention_mask=mask))
    assert ours.dtype == plain.dtype == torch.long and torch.equal(ours, plain)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cut", ["length", "batch"])
def test_5_attention_mask_of_another_shape(generate, path: str, cut: str) -> None:
    mask = ragged_batch(2)[1]
    mask = mask[:, 1:] if cut == "length" else mask[1:]  # (a mask of ones only is dropped by transformers)
    shape = tuple(mask.shape)
    with pytest.raises(ValueError, match=rf"`attention_mask` has shape \({shape[0]}, {shape[1]}\) but `input_ids`"):
        generate(path)(**_prompts(attention_mask=mask))


@pytest.mark.parametrize("path", PATHS)
def test_6_max_new_tokens_zero_is_refused_as_plain_generate_refuses_it(generate, models, path: str) -> None:
    with pytest.raises(ValueError, match="`max_new_tokens` must be greater than 0") as plain:
        models["draft"].generate(**_prompts(max_new_tokens=0))
    with pytest.raises(ValueError, match="`max_new_tokens` must be greater than 0") as ours:
        generate(path)(**_prompts(max_new_tokens=0))
    assert str(ours.value) == str(plain.value)


# Rows 7-13: the models -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_7_a_draft_in_another_dtype_drafts_and_the_target_decides(models, path: str) -> None:
    draft = copy.deepcopy(models["draft"]).to(torch.bfloat16)
    plain = models["target"].generate(**_prompts(max_new_tokens=12))
    assert torch.equal(_speculative(path, models["target"], draft)(**_prompts(max_new_tokens=12)), plain)


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_7_a_draft_without_weights(models, path: str) -> None:
    """A draft on another device works (drafts move to the target's device); one on the 'meta' device has no
    weights to run."""
    draft = copy.deepcopy(models["draft"]).to("meta")
    with pytest.raises(ValueError, match=r"draft's weights are on the 'meta' device.*Load the draft's weights"):
        _speculative(path, models["target"], draft)(**_prompts())


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_8_the_target_as_its_own_draft(models, path: str) -> None:
    target = models["target"]
    with pytest.raises(ValueError, match=r"`assistant=` is the target itself.*slower than plain decoding"):
        _speculative(path, target, target)(**_prompts())
    # A separate copy with equal weights is another model: allowed (and exact).
    twin = _speculative(path, target, copy.deepcopy(target))(**_prompts())
    assert torch.equal(twin, target.generate(**_prompts()))


def _t5() -> PreTrainedModel:
    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, decoder_start_token_id=PAD
    )
    return T5ForConditionalGeneration(config).eval()


@pytest.mark.parametrize("path", PATHS)
def test_9_encoder_decoder_target(path: str) -> None:
    with pytest.raises(ValueError, match=r"The target \(T5ForConditionalGeneration\) is an encoder-decoder model"):
        _speculative(path, _t5(), tiny_model("llama", seed=1, num_layers=1))(**_prompts())


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_9_encoder_decoder_draft(models, path: str) -> None:
    with pytest.raises(ValueError, match=r"The draft \(T5ForConditionalGeneration\) is an encoder-decoder model"):
        _speculative(path, models["target"], _t5())(**_prompts())


def _recurrent(kind: str) -> PreTrainedModel:
    torch.manual_seed(0)
    special = {"pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS}
    if kind == "mamba":
        return MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, **special)).eval()
    config = RwkvConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, **special)
    return RwkvForCausalLM(config).eval()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["mamba", "rwkv"])
def test_10_recurrent_target(path: str, kind: str) -> None:
    with pytest.raises(ValueError, match=r"The target \(\w+\) keeps a recurrent state.*cannot be rolled back"):
        _speculative(path, _recurrent(kind), tiny_model("llama", seed=1, num_layers=1))(**_prompts())


@pytest.mark.parametrize("path", DRAFT_PATHS)
@pytest.mark.parametrize("kind", ["mamba", "rwkv"])
def test_10_recurrent_draft(models, path: str, kind: str) -> None:
    with pytest.raises(ValueError, match=r"The draft \(\w+\) keeps a recurrent state.*cannot be rolled back"):
        _speculative(path, models["target"], _recurrent(kind))(**_prompts())


@pytest.mark.parametrize("path", PATHS)
def test_11_beam_search(generate, path: str) -> None:
    with pytest.raises(ValueError, match=r"Beam search \(num_beams=2\) cannot be combined with .*Use num_beams=1"):
        generate(path)(**_prompts(num_beams=2))


def _tokenizer(prefix: str) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"{prefix}{i}": i for i in range(VOCAB)}, unk_token=f"{prefix}0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@pytest.mark.parametrize("path", DRAFT_PATHS)
def test_12_a_draft_with_another_tokenizer(models, path: str) -> None:
    target, draft = models["target"], models["draft"]
    # Told by the tokenizers: same size, other tokens.
    with pytest.raises(ValueError, match="tokenizers have different vocabularies"):
        _speculative(path, target, draft)(**_prompts(tokenizer=_tokenizer("a"), assistant_tokenizer=_tokenizer("b")))
    # Told by the models alone: another number of logits, or another BOS id.
    other_size = LlamaForCausalLM(LlamaConfig(**{**draft.config.to_dict(), "vocab_size": VOCAB + 4})).eval()
    with pytest.raises(ValueError, match=r"The target scores 96 tokens and the draft 100.*`assistant_tokenizer=`"):
        _speculative(path, target, other_size)(**_prompts())
    other_bos = LlamaForCausalLM(LlamaConfig(**{**draft.config.to_dict(), "bos_token_id": 4})).eval()
    with pytest.raises(ValueError, match="bos_token_id is 1 but the draft's is 4: they likely use different"):
        _speculative(path, target, other_bos)(**_prompts())


def test_13_medusa_heads_for_another_base(tmp_path: Path) -> None:
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


@pytest.mark.parametrize("path", PATHS)
def test_padding_inside_a_prompt_on_a_sliding_window_model(path: str) -> None:
    """Found by the fuzzer: transformers counts a sliding window over padding, speculative decoding over real
    tokens; they agree for left padding only, so padding after a real token is refused on such models."""
    ids, mask = ragged_batch(2)
    mask = mask.clone()
    mask[0, 5] = 0  # row 0: a hole inside its prompt
    generate = _speculative(path, tiny_model("mistral", seed=0), tiny_model("mistral", seed=1, num_layers=1))
    with pytest.raises(ValueError, match=r"sliding window.*Pad on the left only"):
        generate(input_ids=ids, attention_mask=mask, max_new_tokens=4)
    ids, mask = ragged_batch(2)  # left padding is fine
    assert generate(input_ids=ids, attention_mask=mask, max_new_tokens=4).shape[0] == 2
