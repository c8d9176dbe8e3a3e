"""Every speculative path reads generate()'s arguments as plain generate() does: explicit `None`s,
stop strings, rows that stop without an EOS id, prefix-reading callbacks, stateful processors, and a draft
whose embedding matrix is smaller than the target's logits."""

from __future__ import annotations

import copy
import string

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Split
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
    SynthIDTextWatermarkingConfig,
)

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM
from tests.tiny_models import EOS, PAD, VOCAB, ragged_batch, tiny_model

PATHS = ["assistant", "lookup", "hybrid", "medusa", "dynamic", "medusa-lookup"]


def _target() -> torch.nn.Module:
    return hf_specdec.speculative(tiny_model("llama", seed=0, sharpen=4.0))


def _generate(path: str, target, **kwargs):
    """generate() of `target` on a speculative path (the draft and heads are random: losslessness does not
    depend on their quality)."""
    if path in ("assistant", "hybrid"):
        kwargs["assistant"] = tiny_model("llama", seed=1, num_layers=1, sharpen=4.0)
    if path in ("lookup", "hybrid", "medusa-lookup"):
        kwargs["prompt_lookup_num_tokens"] = 4
    if path.startswith("medusa") or path == "dynamic":
        torch.manual_seed(5)
        model = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=3))
        tree = DynamicTree(num_nodes=6) if path == "dynamic" else 5
        return model.generate(medusa=True, tree=tree, **kwargs)
    return target.generate(**kwargs)


_CHARS = string.ascii_letters + string.digits + "!#$%&()*+,-./:;<=>?@[]^_{|}~"


def _tokenizer(size: int = VOCAB) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over the first `size` ids (a stop string is then a string of tokens)."""
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "<unk>", "</s>", *_CHARS[: size - 4]])}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("path", PATHS)
def test_an_explicit_none_is_not_replaced_by_the_models_default(path: str) -> None:
    target = _target()
    ids, mask = ragged_batch(3, seed=2)
    plain_free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16)
    target.generation_config.eos_token_id = int(plain_free[0, 12])  # a token plain decoding emits
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 16, "eos_token_id": None}
    plain = target.generate(**kwargs)
    assert torch.equal(plain, plain_free)  # plain decoding runs past the model's EOS id
    assert torch.equal(_generate(path, target, **kwargs), plain)
    # The model's EOS stops plain decoding when the call does not override it; the speculative paths too.
    del kwargs["eos_token_id"]
    assert torch.equal(_generate(path, target, **kwargs), target.generate(**kwargs))


@pytest.mark.parametrize("path", PATHS)
def test_top_k_none_samples_from_the_whole_vocabulary(path: str) -> None:
    target = _target()
    target.generation_config.top_k = 1
    ids, mask = ragged_batch(2, seed=3)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 4, "do_sample": True, "top_k": None}
    kwargs |= {"return_dict_in_generate": True, "output_scores": True}
    plain = target.generate(**kwargs)
    ours = _generate(path, target, **kwargs)
    # The first token's scores depend on the prompt alone: the same processors must have produced them.
    assert torch.isfinite(plain.scores[0]).sum() > 2 * 2  # more than top-1 per row
    torch.testing.assert_close(ours.scores[0], plain.scores[0])


@pytest.mark.parametrize("path", PATHS)
def test_stop_strings_with_a_tokenizer(path: str) -> None:
    target = _target()
    ids, mask = ragged_batch(3, seed=4)
    plain_free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12)
    tokenizer = _tokenizer()
    stop = tokenizer.decode(plain_free[1, 14:16])  # two tokens row 1 generates
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 12}
    kwargs |= {"stop_strings": [stop], "tokenizer": tokenizer}
    plain = target.generate(**kwargs)
    assert plain.shape[1] <= plain_free.shape[1]
    assert torch.equal(_generate(path, target, **kwargs), plain)


class _StopOn(StoppingCriteria):
    """Stops a row once its last token is one of `tokens` (depends on the prefix alone, not the row index)."""

    def __init__(self, tokens: set[int]) -> None:
        self.tokens = torch.tensor(sorted(tokens))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs) -> torch.Tensor:
        return torch.isin(input_ids[:, -1], self.tokens)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("eos", [None, EOS])
def test_rows_stopped_by_a_criterion_continue_when_there_is_no_eos(path: str, eos: int | None) -> None:
    target = _target()
    ids, mask = ragged_batch(3, seed=6)
    free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, eos_token_id=None)
    # Row 0 stops early, row 2 later, row 1 (maybe) never.
    criteria = StoppingCriteriaList([_StopOn({int(free[0, 13]), int(free[2, 20])})])
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 20, "eos_token_id": eos}
    kwargs |= {"stopping_criteria": criteria, "return_dict_in_generate": True, "output_scores": True}
    plain = target.generate(**kwargs)
    ours = _generate(path, target, **kwargs)
    assert torch.equal(ours.sequences, plain.sequences)
    assert len(ours.scores) == len(plain.scores)
    if eos is None:  # no row is padded: all of them ran to where the last one stopped
        assert not (plain.sequences[:, ids.shape[1] :] == PAD).all(dim=1).any()
        torch.testing.assert_close(torch.stack(ours.scores), torch.stack(plain.scores))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("do_sample", [False, True])
def test_prefix_callbacks_see_only_prefixes_plain_decoding_can_produce(path: str, do_sample: bool) -> None:
    target = _target()
    ids, mask = ragged_batch(3, seed=8)
    allowed = set(range(40, 60)) | {EOS}
    seen: list[tuple[int, list[int]]] = []

    def only_allowed(batch_id: int, sent: torch.Tensor) -> list[int]:
        # Generated tokens come from `allowed`; a finished row shows padding after them.
        generated = sent[ids.shape[1] :].tolist()
        real = generated[: generated.index(PAD)] if PAD in generated else generated
        if any(t not in allowed for t in real) or any(t != PAD for t in generated[len(real) :]):
            raise AssertionError(f"row {batch_id} scored after a prefix plain decoding cannot produce: {generated}")
        seen.append((batch_id, generated))
        return sorted(allowed)

    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 14, "do_sample": do_sample}
    kwargs["prefix_allowed_tokens_fn"] = only_allowed
    torch.manual_seed(0)
    ours = _generate(path, target, **kwargs)
    assert seen
    if not do_sample:
        assert torch.equal(ours, target.generate(**kwargs))


def test_synthid_watermarking_is_refused() -> None:
    target = _target()
    ids, mask = ragged_batch(2)
    watermark = SynthIDTextWatermarkingConfig(keys=[11, 12, 13, 14], ngram_len=3)
    for path in ("assistant", "lookup", "medusa"):
        with pytest.raises(ValueError, match="SynthID"):
            _generate(path, target, input_ids=ids, attention_mask=mask, do_sample=True, watermarking_config=watermark)


def _padded_target(rows: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=rows,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=1,
    )
    torch.manual_seed(rows)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_draft_with_a_smaller_embedding_matrix_never_drafts_ids_it_cannot_read(do_sample: bool) -> None:
    """Same tokenizer (64 tokens), a target padded to 96 rows and a draft to 64: the target may emit ids the
    draft has no embedding for (here made likely by a sequence bias)."""
    target, draft = hf_specdec.speculative(_padded_target(96)), _padded_target(64)
    ids, mask = ragged_batch(2, seed=9)
    ids = ids % 64
    tokenizer = _tokenizer(64)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 16, "do_sample": do_sample}
    kwargs["sequence_bias"] = {(80,): 4.0, (90,): 4.0}
    torch.manual_seed(0)
    plain = target.generate(**kwargs)
    torch.manual_seed(0)
    ours = target.generate(**kwargs, assistant=draft, tokenizer=tokenizer, assistant_tokenizer=copy.copy(tokenizer))
    assert (ours[:, ids.shape[1] :] >= 64).any()  # the draft really read past its vocabulary
    if not do_sample:
        assert torch.equal(ours, plain)


class _OnlyAllowed(LogitsProcessor):
    """A user constraint: only `allowed` tokens after the prompt (raising, as a parser of the prefix may, when
    called on a prefix that breaks it), by masking alone (no fallback when nothing is left)."""

    def __init__(self, prompt_length: int, allowed: set[int]) -> None:
        self.prompt_length, self.allowed = prompt_length, torch.tensor(sorted(allowed))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_length :]
        assert bool((torch.isin(generated, self.allowed) | (generated == PAD)).all()), f"impossible {generated}"
        return scores.masked_fill(~torch.isin(torch.arange(scores.shape[-1]), self.allowed), float("-inf"))


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_draft_the_constraints_leave_nothing_to_propose_stops_drafting(do_sample: bool) -> None:
    """Found by the fuzzer: where the processors rule out every token a draft can propose (here a draft
    vocabulary disjoint from what a user processor allows), the row stops drafting; no processor then sees a
    token the constraint forbids (before the fix the row drafted token 0 and the next position raised)."""
    target = _target()
    ids, mask = ragged_batch(2, seed=8)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 8, "do_sample": do_sample}
    kwargs["logits_processor"] = LogitsProcessorList([_OnlyAllowed(ids.shape[1], set(range(50, 60)))])
    draft = tiny_model("llama", seed=1, num_layers=1, sharpen=4.0)
    torch.manual_seed(0)
    out = target.generate(**kwargs, assistant=draft, assistant_vocab=list(range(10, 40)), return_dict_in_generate=True)
    assert int(out.speculative.drafted_tokens.sum()) == 0  # nothing the draft could propose was allowed
    if not do_sample:
        assert torch.equal(out.sequences, target.generate(**kwargs))


class _StopAtLength(StoppingCriteria):
    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


@pytest.mark.parametrize("limit", ["max_length", "eos"])
def test_a_criterion_stops_a_row_before_its_eos_or_length_limit_in_the_same_step(limit: str) -> None:
    """Found in review: a stopping criterion that fires on a token before the step's EOS (or before the length
    limit) must stop the row there, as in plain decoding (the rows stop in `TokenBuffer`, shared by every path;
    the target's twin drafts, so that one step commits all of these tokens)."""
    target = _target()
    ids, mask = ragged_batch(1, seed=0)
    prompt = ids.shape[1]
    kwargs = {"input_ids": ids, "attention_mask": mask, "do_sample": False}
    kwargs["max_new_tokens"] = 4 if limit == "max_length" else 20
    free = target.generate(**kwargs, eos_token_id=None)
    kwargs["eos_token_id"] = int(free[0, prompt + 3]) if limit == "eos" else EOS
    criteria = StoppingCriteriaList([_StopAtLength(prompt + 2)])
    plain = target.generate(**kwargs, stopping_criteria=criteria)
    assert plain.shape[1] == prompt + 2
    twin = {"assistant": copy.deepcopy(target), "num_assistant_tokens": 8, "num_assistant_tokens_schedule": "constant"}
    assert torch.equal(target.generate(**kwargs, stopping_criteria=criteria, **twin), plain)


@pytest.mark.parametrize("path", ["twin", *PATHS])
def test_nothing_is_scored_after_an_eos(path: str) -> None:
    """Found by the fuzzer's long profile: plain decoding scores no prefix that continues past an EOS (a finished
    row shows padding); drafted nodes after an EOS must not be scored either."""
    target = _target()
    ids, mask = ragged_batch(2, seed=3)
    free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, eos_token_id=None)
    eos = int(free[0, ids.shape[1] + 5])  # a token row 0 emits mid-generation

    def no_continuation_after_eos(batch_id: int, sent: torch.Tensor) -> list[int]:
        generated = sent[ids.shape[1] :].tolist()
        if eos in generated:
            after = generated[generated.index(eos) + 1 :]
            assert all(t == PAD for t in after), f"scored after EOS: {generated}"
        return list(range(VOCAB))

    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 16, "eos_token_id": eos}
    kwargs["prefix_allowed_tokens_fn"] = no_continuation_after_eos
    plain = target.generate(**kwargs)
    if path == "twin":  # drafts run on past the EOS
        twin = {"num_assistant_tokens": 8, "num_assistant_tokens_schedule": "constant"}
        ours = target.generate(**kwargs, assistant=copy.deepcopy(target), **twin)
    else:
        ours = _generate(path, target, **kwargs)
    assert torch.equal(ours, plain)
