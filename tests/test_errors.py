"""Bad input gets a clear error that says what to do; nothing is silently ignored."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

import hf_specdec
from tests.tiny_models import ragged_batch, tiny_model, tiny_target


@pytest.fixture(scope="module")
def pair():
    return tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1)


def _generate(target, draft, **kwargs):
    ids, mask = ragged_batch(2)
    return target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, assistant=draft, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_beams": 2}, "Beam search"),
        ({"output_attentions": True, "return_dict_in_generate": True}, "not available with `assistant=`"),
        ({"num_assistant_tokens": 0}, "positive integer"),
        ({"num_assistant_tokens_schedule": "sometimes"}, "must be one of"),
        ({"assistant_confidence_threshold": 1.5}, r"\[0, 1\)"),
        ({"stop_strings": ["foo"]}, "tokenizer"),
        ({"penalty_alpha": 0.6, "top_k": 4}, "another decoding strategy"),
        ({"prompt_lookup_num_tokens": 0}, "positive integer"),
        ({"max_matching_ngram_size": 2}, "pass `prompt_lookup_num_tokens` too"),
        ({"use_cache": False}, "use_cache=False"),
        ({"cache_implementation": "offloaded"}, "cache_implementation"),
        ({"assistant_vocab": [1, 500]}, "outside the model's"),
        ({"assistant_vocab": [4, 4]}, "repeated"),
    ],
)
def test_unsupported_settings(pair, kwargs: dict, message: str) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match=message):
        _generate(target, draft, **kwargs)


def test_model_inputs_that_drafting_cannot_carry() -> None:
    target, draft = tiny_target("gpt2"), tiny_model("gpt2", seed=0, num_layers=1)
    with pytest.raises(ValueError, match="`input_ids` and `attention_mask` only"):
        _generate(target, draft, token_type_ids=torch.zeros(2, 10, dtype=torch.long))


def test_assistant_and_assistant_model_together(pair) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="assistant_model"):
        _generate(target, draft, assistant_model=draft)


def test_vocabulary_size_mismatch_without_tokenizers(pair) -> None:
    target, _ = pair
    config = LlamaConfig(**{**target.config.to_dict(), "vocab_size": 100})
    with pytest.raises(ValueError, match="pass each model's tokenizer"):
        _generate(target, LlamaForCausalLM(config).eval())


def test_different_bos_token_means_a_different_tokenizer(pair) -> None:
    target, _ = pair
    config = LlamaConfig(**{**target.config.to_dict(), "bos_token_id": 4})
    with pytest.raises(ValueError, match="bos_token_id"):
        _generate(target, LlamaForCausalLM(config).eval())


def test_a_different_eos_token_is_fine(pair) -> None:
    """A base draft for an instruct target often has another EOS id; the target's decides when to stop."""
    target, _ = pair
    config = LlamaConfig(**{**target.config.to_dict(), "eos_token_id": 4})
    assert _generate(target, LlamaForCausalLM(config).eval()).shape[0] == 2


def test_encoder_decoder_target() -> None:
    config = T5Config(vocab_size=96, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, decoder_start_token_id=0)
    t5 = hf_specdec.speculative(T5ForConditionalGeneration(config).eval())
    with pytest.raises(ValueError, match="encoder-decoder"):
        t5.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=3, assistant=t5)


def test_attention_implementation_without_4d_masks(pair) -> None:
    target = tiny_target("llama")
    target.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        _generate(target, pair[1])


def test_speculative_rejects_non_models() -> None:
    with pytest.raises(TypeError, match="PreTrainedModel"):
        hf_specdec.speculative(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_a_cache_that_is_not_a_cache_is_refused(pair) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="takes a transformers Cache"):
        _generate(target, draft, cache=object())


def test_models_without_position_ids_are_refused() -> None:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    bloom = hf_specdec.speculative(BloomForCausalLM(BloomConfig(vocab_size=96, hidden_size=32, n_layer=1, n_head=2)))
    with pytest.raises(ValueError, match="position_ids"):
        bloom.eval().generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=3, assistant=bloom)


def test_assistant_vocab_without_an_assistant(pair) -> None:
    target, _ = pair
    with pytest.raises(ValueError, match="pass a draft model too"):
        target.generate(input_ids=torch.tensor([[5, 6]]), max_new_tokens=2, assistant_vocab=[1, 2])


class _Broken(LlamaForCausalLM):
    """A model whose own forward fails on any input (as some configs' do), or only on 4D masks."""

    only_4d_masks = False

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        kwargs.update(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        mask = attention_mask
        if not self.only_4d_masks or (isinstance(mask, torch.Tensor) and mask.dim() == 4):
            raise RuntimeError("shape mismatch in the model's own layers")
        return super().forward(**kwargs)


@pytest.mark.parametrize("only_4d_masks", [False, True])
def test_a_failing_forward_is_blamed_on_what_fails(only_4d_masks: bool) -> None:
    torch.manual_seed(0)
    model = _Broken(tiny_model("llama", seed=0).config).eval()
    model.only_4d_masks = only_4d_masks
    target = hf_specdec.speculative(model)
    ids, mask = ragged_batch(2)
    message = "the custom 4D attention mask" if only_4d_masks else "own forward fails on these inputs"
    with pytest.raises(ValueError, match=message):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, prompt_lookup_num_tokens=3)
