"""The demo's verdict: where a run parts from plain's, between which tokens, and whether at a numerical tie (the
target scoring both alike) or not."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from hf_specdec.bench.demo_verdict import Parting, describe, partings, verdict_lines
from tests.tiny_models import EOS, PAD, VOCAB, tiny_model


def _tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w5"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=f"w{PAD}", eos_token=f"w{EOS}")


@pytest.fixture(scope="module")
def twin_tokens() -> tuple[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor]:
    """A model whose output layer scores tokens 10 and 11 alike everywhere, and its greedy text."""
    model = tiny_model("llama", 0, sharpen=4.0)
    with torch.no_grad():
        weight = model.get_output_embeddings().weight
        weight[11] = weight[10]
        weight[10] += 10 * weight.std()  # 10 and 11 the likeliest tokens, tied
        weight[11] = weight[10]
    inputs = {"input_ids": torch.tensor([[4, 5, 6, 7]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    plain = model.generate(**inputs, max_new_tokens=6, do_sample=False, eos_token_id=None)
    return model, inputs, plain


def test_a_run_parting_at_a_tie_is_explained_as_one(twin_tokens: tuple) -> None:
    model, inputs, plain = twin_tokens
    assert int(plain[0, 4 + 2]) == 10  # plain's greedy choice between the tied tokens: the first
    other = plain.clone()
    other[0, 4 + 2 :] = 11  # the other tied token, from the third generated token on
    found = partings(model, _tokenizer(), plain, other, inputs)
    assert found == [Parting(row=0, position=3, plain_token="w10", other_token="w11", gap=0.0)]
    text = describe(found[0], torch.bfloat16, 1)
    assert "at generated token 3:" in text and "'w10'" in text and "'w11'" in text
    assert "within bfloat16's rounding" in text and "--dtype float32" in text
    lines, passed = verdict_lines(found, [[]], torch.bfloat16, 1)
    assert passed and lines[0].startswith("tokens: the median run parts from plain's") and "(1 of 2" in lines[0]
    assert not verdict_lines(found, [], torch.float32, 1)[1]  # float32 holds to identical tokens
    lines, passed = verdict_lines([], [found], torch.bfloat16, 1)  # the run shown identical, another at a tie
    assert passed and lines[0] == "tokens: identical to plain generate()'s (1 of 2 timed runs identical)"
    assert "part from plain's at numerical ties only" in lines[1]


def test_a_run_parting_where_plain_is_sure_is_reported(twin_tokens: tuple) -> None:
    model, inputs, plain = twin_tokens
    other = plain.clone()
    other[0, 4 + 1] = 50  # far from plain's choice there
    found = partings(model, _tokenizer(), plain, other, inputs)
    assert len(found) == 1 and found[0].position == 2 and found[0].gap is not None and found[0].gap > 1.0
    assert "NOT a numerical tie" in describe(found[0], torch.bfloat16, 1)
    lines, passed = verdict_lines([], [found], torch.bfloat16, 1)  # the run shown identical, another not
    assert not passed
    assert lines[0] == "tokens: identical to plain generate()'s (1 of 2 timed runs identical)"
    assert "another timed run parts" in lines[1] and "NOT a numerical tie" in lines[1]
