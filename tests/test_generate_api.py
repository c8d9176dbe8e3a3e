"""`generate(assistant=...)` follows transformers' conventions: configs, outputs, streamers, criteria."""

from __future__ import annotations

import copy

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

import hf_specdec
from tests.tiny_models import VOCAB, ragged_batch, tiny_model, tiny_target


def _pair(arch: str = "llama"):
    return tiny_target(arch), tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)


def test_without_assistant_generate_is_transformers_own() -> None:
    target, _ = _pair()
    reference = tiny_model("llama", seed=0, sharpen=4.0)  # same weights, original class
    ids, mask = ragged_batch(3)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(**kwargs), reference.generate(**kwargs))
    assert isinstance(target, hf_specdec.SpeculativeGenerationMixin)
    assert type(target).__name__ == "LlamaForCausalLM"


def test_save_pretrained_keeps_the_architecture(tmp_path) -> None:
    target, _ = _pair()
    target.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    assert not isinstance(reloaded, hf_specdec.SpeculativeGenerationMixin)


def test_mixin_can_be_inherited_directly() -> None:
    class MyLlama(hf_specdec.SpeculativeGenerationMixin, type(tiny_model("llama", seed=0))):
        pass

    target = MyLlama(tiny_model("llama", seed=0).config).eval()
    ids, mask = ragged_batch(2)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    assert torch.equal(target.generate(**kwargs, assistant=copy.deepcopy(target)), target.generate(**kwargs))


def test_generation_config_object_and_dict_output() -> None:
    target, draft = _pair()
    ids, mask = ragged_batch(3)
    config = GenerationConfig(
        max_new_tokens=15,
        do_sample=False,
        num_assistant_tokens=3,
        num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True,
    )
    out = target.generate(input_ids=ids, attention_mask=mask, generation_config=config, assistant=draft)
    assert isinstance(out, hf_specdec.SpeculativeDecoderOnlyOutput)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=15, do_sample=False)
    assert torch.equal(out.sequences, plain)
    stats = out.speculative
    assert stats.target_forwards.shape == (3,)
    assert (stats.drafted_tokens <= 3 * stats.target_forwards).all()  # at most 3 drafts per step
    assert (stats.tau >= 1).all() and (stats.tau <= 4).all()
    assert stats.drafted_at_position.shape == (3,)
    assert (stats.accepted_at_position[1:] <= stats.accepted_at_position[:-1]).all()  # accepted prefixes


class _Collect(BaseStreamer):
    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.reshape(-1))

    def end(self) -> None:
        self.ended = True


def test_streamer_receives_prompt_then_one_token_per_position() -> None:
    target = tiny_target("llama")
    ids, _ = ragged_batch(1)
    streamer = _Collect()
    # The target's twin drafting: every draft accepted, several tokens a step, streamed one position at a time.
    out = target.generate(
        input_ids=ids, max_new_tokens=20, do_sample=False, assistant=copy.deepcopy(target), streamer=streamer
    )
    assert streamer.ended
    assert torch.equal(torch.cat(streamer.chunks), out[0])
    assert len(streamer.chunks) == 1 + out.shape[1] - ids.shape[1]  # as plain decoding puts them


class _StopAfterToken(StoppingCriteria):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return input_ids[:, -1] == self.token


def test_custom_stopping_criteria_stop_each_row_where_plain_decoding_does() -> None:
    target, draft = _pair()
    ids, mask = ragged_batch(3, seed=4)
    free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    token = int(free[1, ids.shape[1] + 4])
    criteria = StoppingCriteriaList([_StopAfterToken(token)])
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    plain = target.generate(**kwargs, stopping_criteria=criteria)
    spec = target.generate(**kwargs, stopping_criteria=criteria, assistant=draft)
    assert torch.equal(spec, plain)


def test_sampling_is_reproducible_with_a_generator_and_supports_num_return_sequences() -> None:
    target, draft = _pair()
    ids, mask = ragged_batch(2)
    # Fixed costs: with measured ones the draft lengths follow the clock, which keeps the distribution, not the draw.
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=True,
        top_k=20,
        temperature=0.8,
        speculative_costs=hf_specdec.SpeculativeCosts(draft_forward=0.3, verify_per_token=0.05),
    )
    a = target.generate(**kwargs, assistant=draft, generator=torch.Generator().manual_seed(3), num_return_sequences=3)
    b = target.generate(**kwargs, assistant=draft, generator=torch.Generator().manual_seed(3), num_return_sequences=3)
    assert a.shape[0] == 6
    assert torch.equal(a, b)
    # The global seed works too, as with plain sampling.
    torch.manual_seed(5)
    c = target.generate(**kwargs, assistant=draft)
    torch.manual_seed(5)
    assert torch.equal(c, target.generate(**kwargs, assistant=draft))


def _tokenizer(size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")))


def test_draft_with_a_padded_vocabulary_and_the_same_tokenizer() -> None:
    """Embedding matrices padded to different sizes are fine once the tokenizers prove the ids agree."""
    target = tiny_target("llama")
    config = tiny_model("llama", seed=0).config
    config.vocab_size = VOCAB + 32
    torch.manual_seed(0)
    draft = type(target).__mro__[2](config).eval()  # the original LlamaForCausalLM class
    ids, mask = ragged_batch(2)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=15, do_sample=False)
    tok = _tokenizer(VOCAB)
    out = target.generate(**kwargs, assistant=draft, tokenizer=tok, assistant_tokenizer=_tokenizer(VOCAB))
    assert torch.equal(out, target.generate(**kwargs))
    # Another vocabulary: the draft drafts through text (tests/test_different_tokenizers.py), still identical.
    other = target.generate(**kwargs, assistant=draft, tokenizer=tok, assistant_tokenizer=_tokenizer(VOCAB - 1))
    assert torch.equal(other, out)


def test_user_logits_processor_and_prefix_constraint_keep_identity() -> None:
    from transformers import LogitsProcessor, LogitsProcessorList

    class BanOddTokens(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores = scores.clone()
            scores[:, 1::2] = float("-inf")
            return scores

    target, draft = _pair()
    ids, mask = ragged_batch(3, seed=9)

    def allowed(batch_id: int, prefix: torch.Tensor) -> list[int]:
        return list(range(4 + batch_id, VOCAB, 3))  # depends on the row, as the hook allows

    for extra in ({"logits_processor": LogitsProcessorList([BanOddTokens()])}, {"prefix_allowed_tokens_fn": allowed}):
        kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, **extra)
        assert torch.equal(target.generate(**kwargs, assistant=draft), target.generate(**kwargs))


def test_inputs_embeds_are_refused() -> None:
    target, draft = _pair()
    ids, mask = ragged_batch(2)
    embeds = target.get_input_embeddings()(ids)
    try:
        target.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=4, assistant=draft)
    except ValueError as error:
        assert "input_ids" in str(error)
    else:
        raise AssertionError("inputs_embeds must be refused")


def test_output_scores_and_logits_match_plain_decoding() -> None:
    target, draft = _pair()
    ids, mask = ragged_batch(3, seed=6)
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=False,
        repetition_penalty=1.3,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    plain = target.generate(**kwargs)
    spec = target.generate(**kwargs, assistant=draft)
    assert torch.equal(spec.sequences, plain.sequences)
    assert len(spec.scores) == len(plain.scores) == len(spec.logits)
    compared = 0
    for ours, theirs, our_logits, their_logits in zip(
        spec.scores, plain.scores, spec.logits, plain.logits, strict=True
    ):
        running = our_logits.abs().sum(dim=-1) > 0  # rows that had not finished: zeros after a row's end
        torch.testing.assert_close(ours[running], theirs[running], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(our_logits[running], their_logits[running], rtol=1e-4, atol=1e-4)
        compared += int(running.sum())
    assert compared >= 12
