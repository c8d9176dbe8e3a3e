"""transformers' text-generation pipeline over this library's models: a heads model (`MedusaForCausalLM`) and a
model given speculative `generate()`, with the speculative arguments passed through the pipeline's call."""

from __future__ import annotations

import logging
import string

import pytest
from tokenizers import Regex, Tokenizer, decoders
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Split
from transformers import PreTrainedTokenizerFast, pipeline

import hf_specdec
from hf_specdec import MedusaConfig, MedusaForCausalLM
from tests.tiny_models import VOCAB, tiny_model

_CHARS = string.ascii_letters + string.digits + "!#$%&()*+,-./:;<=>?@[]^_{|}~"
PROMPTS = ["abcabcab", "x+y=z;x+y"]


def _tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over the tiny models' ids."""
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "<unk>", "</s>", *_CHARS[: VOCAB - 4]])}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.padding_side = "left"
    return tokenizer


def _texts(results: list) -> list[str]:
    return [result[0]["generated_text"] for result in results]


@pytest.mark.parametrize("head_type", ["medusa", "recurrent"])
def test_a_heads_model_runs_in_the_text_generation_pipeline(head_type: str, caplog: pytest.LogCaptureFixture) -> None:
    base = tiny_model("llama", seed=0, sharpen=4.0)
    heads = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, head_type=head_type))
    tokenizer = _tokenizer()
    call = {"max_new_tokens": 12, "do_sample": False}
    plain = _texts(pipeline("text-generation", model=base, tokenizer=tokenizer)(PROMPTS, **call))
    with caplog.at_level(logging.ERROR):
        generator = pipeline("text-generation", model=heads, tokenizer=tokenizer)
    assert "not supported" not in caplog.text
    assert generator.model is heads
    assert _texts(generator(PROMPTS, **call, medusa=True)) == plain
    assert _texts(generator(PROMPTS, **call, medusa=True, batch_size=2)) == plain
    assert _texts(generator(PROMPTS, **call)) == plain  # without medusa=True: the base's own generate()


def test_a_speculative_model_takes_its_arguments_through_the_pipeline() -> None:
    target, draft = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, num_layers=1)
    tokenizer = _tokenizer()
    call = {"max_new_tokens": 12, "do_sample": False}
    plain = _texts(pipeline("text-generation", model=target, tokenizer=tokenizer)(PROMPTS, **call))
    generator = pipeline("text-generation", model=hf_specdec.speculative(target), tokenizer=tokenizer)
    for extra in ({"assistant": draft}, {"prompt_lookup_num_tokens": 3}, {"assistant_early_exit": 1}):
        assert _texts(generator(PROMPTS, **call, **extra, batch_size=2)) == plain
    assert isinstance(target, hf_specdec.SpeculativeGenerationMixin)
