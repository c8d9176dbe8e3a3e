"""A draft model whose tokenizer differs from the target's (`generate(assistant=draft, tokenizer=...,
assistant_tokenizer=...)`): greedy stays token-identical to plain greedy at any batch size, sampling keeps the
target's distribution, and what is not supported is refused.

The tokenizers are trained here, offline, on a fixed text with the `tokenizers` library:

- "words": a word-level target tokenizer, and a draft tokenizer of the same words under other ids; the draft model
  is the target with its embedding and output rows permuted to match, so it predicts the target's text exactly
  and its drafts are accepted;
- "bpe": a BPE target tokenizer that marks word starts with "▁" (Metaspace) and a byte-level BPE draft tokenizer
  ("Ġ") of another size, with random models: token boundaries rarely line up, and the draft reads re-encoded text
  at every step;
- "abc": two BPE tokenizers over the letters a, b, c (8 and 12 tokens), for the exact distributions of sampling.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import hf_specdec
from hf_specdec.drafters.shared_vocab import build_shared_vocabulary
from hf_specdec.drafters.text_alignment import (
    WINDOW,
    RowAlignment,
    Tokenizers,
    common_prefix,
    decode,
    encode,
    target_proposal,
)
from hf_specdec.drafters.translated import TranslatedDrafter
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, marginal, sample_copies, sampling_warpers

TEXT = (
    "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun and a bird sings on the "
    "old tree near the river where children play with their red ball "
) * 4
WORDS = sorted(set(TEXT.split()))


# ---------------------------------------------------------------------------------------------------------
# Tokenizers and models
# ---------------------------------------------------------------------------------------------------------


def word_level(words: list[str]) -> PreTrainedTokenizerFast:
    """Every word one token, in the order given (`<eos>` first), split at whitespace, decoded with spaces."""
    vocab = {token: i for i, token in enumerate(["<eos>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>")


def metaspace_bpe(vocab_size: int, prepend: str = "never") -> PreTrainedTokenizerFast:
    """BPE marking word starts with "▁"; `prepend="always"` as SentencePiece does: a "▁" before the text, which
    decoding drops again (so a decoded piece loses its leading space)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend)
    backend.decoder = decoders.Metaspace(prepend_scheme=prepend)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"], show_progress=False)
    backend.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>")


def byte_level_bpe(vocab_size: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|end|>"], initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>")


def letters_bpe(text: str, vocab_size: int, special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """BPE over the letters of `text`, on the whole text (no pre-tokenizer), decoded by concatenation."""
    backend = Tokenizer(models.BPE())
    backend.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special), show_progress=False)
    backend.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def llama(
    vocab_size: int, seed: int, num_layers: int = 2, sharpen: float = 1.0, eos: int | None = 0
) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos,
        pad_token_id=0,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def qwen2(vocab_size: int, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config).eval()


def permuted_copy(target: PreTrainedModel, draft_ids: list[int]) -> PreTrainedModel:
    """The target as a model over the same tokens under other ids: target token t is draft token `draft_ids[t]`
    (its embedding and output rows move there)."""
    draft = LlamaForCausalLM(target.config).eval()
    state = target.state_dict()
    order = torch.argsort(torch.tensor(draft_ids))  # draft id d is target id order[d]
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = state[name][order]
    draft.load_state_dict(state)
    return draft


@functools.cache
def setup(name: str) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """(target, draft, target tokenizer, draft tokenizer) of a setup (see the module's docstring)."""
    if name == "words":
        target_tokenizer = word_level(WORDS)
        draft_tokenizer = word_level(list(reversed(WORDS)))
        target = hf_specdec.speculative(llama(len(target_tokenizer), seed=0, sharpen=4.0))
        draft_vocab = draft_tokenizer.get_vocab()
        ids = [
            draft_vocab[token] for token in target_tokenizer.convert_ids_to_tokens(list(range(len(target_tokenizer))))
        ]
        draft = permuted_copy(target, ids)
    else:
        target_tokenizer, draft_tokenizer = metaspace_bpe(100), byte_level_bpe(300)
        target = hf_specdec.speculative(llama(len(target_tokenizer), seed=0, sharpen=4.0))
        draft = qwen2(len(draft_tokenizer), seed=1)
    target_tokenizer.padding_side = "left"
    return target, draft, target_tokenizer, draft_tokenizer


PROMPTS = ["the quick brown fox", "a bird sings on the old tree near", "the"]


def _prompts(tokenizer: PreTrainedTokenizerFast, batch: int) -> dict[str, torch.Tensor]:
    encoded = tokenizer(PROMPTS[:batch], return_tensors="pt", padding=True, add_special_tokens=False)
    return {"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask}


# ---------------------------------------------------------------------------------------------------------
# The pieces
# ---------------------------------------------------------------------------------------------------------


def test_shared_tokens_match_across_word_start_markers() -> None:
    """The "▁the" of a SentencePiece-style vocabulary and "Ġthe" of a byte-level one are the same token, both ways,
    one to one; the draft's logits land on the target ids of the tokens they share, -inf elsewhere."""
    target, draft = metaspace_bpe(100), byte_level_bpe(300)
    shared = build_shared_vocabulary(target, draft, len(target), len(draft))
    assert shared.size > 20
    the_target, the_draft = target.get_vocab()["▁the"], draft.get_vocab()["Ġthe"]
    assert int(shared.draft_to_target[the_draft]) == the_target
    assert int(shared.target_to_draft[the_target]) == the_draft
    mapped = shared.draft_to_target[shared.draft_to_target >= 0]
    assert mapped.unique().numel() == mapped.numel()
    logits = torch.randn(2, len(draft))
    translated = shared.target_logits(logits)
    assert translated.shape == (2, len(target))
    assert torch.equal(translated[:, the_target], logits[:, the_draft])
    assert int(torch.isfinite(translated[0]).sum()) == shared.size


def test_sync_rolls_the_draft_back_to_the_tokens_it_shares_with_the_new_encoding() -> None:
    target, draft = metaspace_bpe(100), byte_level_bpe(300)
    row = RowAlignment(Tokenizers(target, draft), fallback_id=0)
    committed = encode(target, "the quick bro")
    keep, feed = row.sync(committed)
    assert keep == 0 and feed == encode(draft, "the quick bro")
    row.fed(encode(draft, "wn fox")[:1])  # a draft the target did not take
    held = list(row.draft_ids)
    committed += encode(target, "wn dog")
    keep, feed = row.sync(committed)
    whole = encode(draft, "the quick brown dog")
    assert row.draft_ids == whole and whole[keep:] == feed
    # "bro" became part of "brown": the draft keeps what it shares with the new encoding, no more.
    assert keep == common_prefix(held, whole) < len(encode(draft, "the quick bro"))


@pytest.mark.parametrize("prepend", ["never", "always"])
def test_sync_moves_its_anchor_and_keeps_spelling_the_text(prepend: str) -> None:
    """Past `WINDOW` target tokens only the last few are re-encoded, and the draft's tokens still spell the text
    (also where the target's tokenizer drops the leading space of every decoded piece)."""
    target, draft = metaspace_bpe(100, prepend), byte_level_bpe(300)
    row = RowAlignment(Tokenizers(target, draft), fallback_id=0)
    ids = encode(target, TEXT[:400])
    assert len(ids) > 3 * WINDOW
    for end in range(1, len(ids) + 1, 3):
        keep, feed = row.sync(ids[:end])
        assert 0 <= keep < len(row.draft_ids) and row.draft_ids[keep:] == feed
        assert decode(draft, row.draft_ids) == decode(target, ids[:end])
    assert row.anchor_target > len(ids) - WINDOW - 3 and row.anchor_draft > 0


def test_proposals_continue_a_word_the_target_split() -> None:
    """The target committed "bro"; the draft's text "wn fox" cannot be merged into the committed tokens, so it is
    proposed as the target's tokenizer encodes it alone."""
    target, draft = metaspace_bpe(100), byte_level_bpe(300)
    committed = [*encode(target, "the quick "), target.get_vocab()["b"], target.get_vocab()["r"]]
    context = encode(draft, "the quick br")
    proposal = target_proposal(Tokenizers(target, draft), committed, context, encode(draft, "own fox"))
    assert decode(target, committed + proposal) == "the quick brown fox"


# ---------------------------------------------------------------------------------------------------------
# Greedy: token identity with plain greedy
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["words", "bpe"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
def test_greedy_is_token_identical_to_plain_greedy(name: str, batch: int, schedule: str) -> None:
    target, draft, target_tokenizer, draft_tokenizer = setup(name)
    kwargs = dict(**_prompts(target_tokenizer, batch), max_new_tokens=40, do_sample=False)
    out = target.generate(
        **kwargs,
        assistant=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        num_assistant_tokens=4,
        num_assistant_tokens_schedule=schedule,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, target.generate(**kwargs))
    if name == "words":  # the draft is the target in other ids: its drafts are the target's tokens
        assert out.speculative.summary()["acceptance_rate"] > 0.9


@pytest.mark.parametrize("arch", ["gpt2", "mistral"])
def test_drafts_with_a_position_table_or_a_sliding_window_keep_identity(arch: str) -> None:
    """A GPT-2 draft of 40 positions stops drafting once a row's text outgrows them; a Mistral draft attends
    through a window of 12 tokens while its rows roll back."""
    target, _, target_tokenizer, draft_tokenizer = setup("bpe")
    torch.manual_seed(2)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=len(draft_tokenizer), n_embd=64, n_layer=1, n_head=4, n_positions=40)
        draft = GPT2LMHeadModel(config).eval()
    else:
        config = MistralConfig(
            vocab_size=len(draft_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=12,
        )  # fmt: skip
        draft = MistralForCausalLM(config).eval()
    kwargs = dict(**_prompts(target_tokenizer, 3), max_new_tokens=30, do_sample=False)
    out = target.generate(
        **kwargs,
        assistant=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, target.generate(**kwargs))
    if arch == "gpt2":  # drafting stopped for good before the end: steps that verified the last token alone
        assert out.speculative.verify_widths.get(1, 0) > 0


def test_a_static_target_cache_keeps_identity() -> None:
    """The target in a static cache (the draft keeps its own dynamic one), on a ragged batch."""
    target, draft, target_tokenizer, draft_tokenizer = setup("bpe")
    kwargs = dict(**_prompts(target_tokenizer, 3), max_new_tokens=20, do_sample=False)
    out = target.generate(
        **kwargs,
        assistant=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        cache_implementation="static",
    )
    assert torch.equal(out, target.generate(**kwargs))


def test_sampling_with_a_processor_that_reads_the_prefix_runs_on_a_ragged_batch() -> None:
    """A repetition penalty reads each row's prefix, the drafted shared tokens included."""
    target, draft, target_tokenizer, draft_tokenizer = setup("words")
    inputs = _prompts(target_tokenizer, 3)
    out = target.generate(
        **inputs,
        max_new_tokens=12,
        do_sample=True,
        repetition_penalty=1.3,
        generator=torch.Generator().manual_seed(0),
        assistant=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (3, inputs["input_ids"].shape[1] + 12)
    assert out.speculative.summary()["accepted_tokens"] > 0  # the permuted draft's q is the target's p


def test_rows_that_stop_early_leave_the_batch() -> None:
    """With an EOS the target reaches in one row long before the others, rows leave the batch mid-call."""
    target, draft, target_tokenizer, draft_tokenizer = setup("bpe")
    kwargs = dict(**_prompts(target_tokenizer, 3), max_new_tokens=30, do_sample=False)
    plain = target.generate(**kwargs)
    width = kwargs["input_ids"].shape[1]
    eos = int(plain[0, width + 4])  # row 0's fifth token
    kwargs["eos_token_id"] = eos
    plain = target.generate(**kwargs)
    ours = target.generate(**kwargs, assistant=draft, tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer)
    assert torch.equal(ours, plain)
    assert (plain[:, width:] == eos).any(dim=1).tolist().count(True) >= 1


# ---------------------------------------------------------------------------------------------------------
# Sampling: the target's distribution exactly
# ---------------------------------------------------------------------------------------------------------

ABC_VOCAB = 8
MAX_NEW = 4
ALPHA = 1e-3
CHECKS = (("token 1", slice(0, 1)), ("tokens 1-2", slice(0, 2)), ("tokens 2-3", slice(1, 3)), ("token 4", slice(3, 4)))


@functools.cache
def abc_setup() -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    target_tokenizer = letters_bpe("abcabcaabbccabacbcab" * 3, ABC_VOCAB)
    # Two special tokens first, so that even the letters have other ids in the draft's vocabulary.
    draft_tokenizer = letters_bpe("abcabcbbaccabacabca" * 3, 12, special=("<s>", "</s>"))
    assert len(target_tokenizer) == ABC_VOCAB
    target = hf_specdec.speculative(llama(ABC_VOCAB, seed=0, sharpen=8.0, eos=None))
    draft = llama(len(draft_tokenizer), seed=1, num_layers=1, sharpen=4.0, eos=None)
    return target, draft, target_tokenizer, draft_tokenizer


@pytest.mark.parametrize("warped", [False, True])
def test_samples_follow_the_target_distribution(warped: bool) -> None:
    target, draft, target_tokenizer, draft_tokenizer = abc_setup()
    shared = build_shared_vocabulary(target_tokenizer, draft_tokenizer, ABC_VOCAB, len(draft_tokenizer))
    assert 3 <= shared.size < ABC_VOCAB  # the letters and some merges: proposals can be accepted, not all tokens
    settings = {"temperature": 0.8, "top_k": 6, "top_p": None} if warped else {"temperature": 1.0, "top_k": None}
    settings.setdefault("top_p", None)
    prompts = (tuple(encode(target_tokenizer, "abcab")), tuple(encode(target_tokenizer, "cc")))
    samples, stats = sample_copies(
        target,
        prompts,
        3000,
        0,
        MAX_NEW,
        seed=7,
        assistant=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        num_assistant_tokens=3,
        num_assistant_tokens_schedule="constant",
        **{k: v for k, v in settings.items() if v is not None},
    )
    rate = stats.summary()["acceptance_rate"]
    assert 0.05 < rate < 0.95, rate  # both acceptance and rejection really happen
    warpers = sampling_warpers(**settings)
    for rows, prompt in zip(samples, prompts, strict=True):
        joint = exact_joint(target, prompt, warpers, ABC_VOCAB, MAX_NEW)
        pvalues = {name: chisquare_pvalue(rows[:, cols], marginal(joint, cols)) for name, cols in CHECKS}
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)


# ---------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"tree": 4}, "`tree=` cannot be combined"),
        ({"assistant_vocab": [1, 2, 3]}, "`assistant_vocab`"),
        ({"prompt_lookup_num_tokens": 3}, "Prompt lookup cannot be combined"),
    ],
)
def test_what_a_draft_of_another_tokenizer_cannot_take_is_refused(extra: dict, match: str) -> None:
    target, draft, target_tokenizer, draft_tokenizer = setup("bpe")
    with pytest.raises(ValueError, match=match):
        target.generate(
            **_prompts(target_tokenizer, 1),
            max_new_tokens=5,
            assistant=draft,
            tokenizer=target_tokenizer,
            assistant_tokenizer=draft_tokenizer,
            **extra,
        )


def test_another_vocabulary_without_both_tokenizers_is_refused() -> None:
    target, draft, target_tokenizer, draft_tokenizer = setup("bpe")
    with pytest.raises(ValueError, match="pass each model's tokenizer"):
        target.generate(**_prompts(target_tokenizer, 1), max_new_tokens=5, assistant=draft)
    with pytest.raises(ValueError, match="needs `tokenizer=` too"):
        target.generate(
            **_prompts(target_tokenizer, 1), max_new_tokens=5, assistant=draft, assistant_tokenizer=draft_tokenizer
        )


def test_a_wrong_q_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: accepting against a q other than the one the proposals were drawn from (uniform over
    q's support) skews the tokens, and the checks above see it."""
    target, draft, target_tokenizer, draft_tokenizer = abc_setup()
    sample = TranslatedDrafter._sample

    def uniform_q(self: TranslatedDrafter, *args: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        token, q, lengths = sample(self, *args)
        support = (q > 0).float()
        return token, support / support.sum(dim=-1, keepdim=True), lengths

    monkeypatch.setattr(TranslatedDrafter, "_sample", uniform_q)
    prompt = tuple(encode(target_tokenizer, "abcab"))
    (rows,), _ = sample_copies(
        target, (prompt,), 3000, 0, MAX_NEW, seed=7, assistant=draft, tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer, num_assistant_tokens=3, num_assistant_tokens_schedule="constant",
    )  # fmt: skip
    joint = exact_joint(target, prompt, sampling_warpers(1.0, None, None), ABC_VOCAB, MAX_NEW)
    pvalues = {name: chisquare_pvalue(rows[:, cols], marginal(joint, cols)) for name, cols in CHECKS}
    assert min(pvalues.values()) < 1e-6, pvalues


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_a_cache_rolled_back_per_row_computes_what_a_fresh_one_does(arch: str) -> None:
    """`CachedSequence.keep_before`: rows roll back to different numbers of their tokens (holes in the middle of
    the cache), then continue; each row's logits are the model's on its kept tokens and the new ones alone (also
    through a sliding window of 12 tokens, which keeps the slots' positions)."""
    from hf_specdec.generation.kv_cache import CachedSequence
    from hf_specdec.trees.masks import chain_structure
    from tests.tiny_models import tiny_model

    cpu = torch.device("cpu")
    model = tiny_model(arch, seed=3)
    rows = [list(range(5, 21)), list(range(30, 46))]  # 16 tokens each
    seq = CachedSequence(model, 2, cpu)
    seq.forward(torch.tensor(rows), None, torch.arange(16).expand(2, 16), chain_structure(16, cpu))
    seq.keep_before(torch.tensor([9, 15]))  # row 0 keeps 9 tokens, row 1 keeps 15
    new = torch.tensor([[50, 51], [0, 52]])
    valid = torch.tensor([[True, True], [False, True]])
    out = seq.forward(new, valid, torch.tensor([[9, 10], [15, 15]]), chain_structure(2, cpu))
    for row, kept in enumerate(([*rows[0][:9], 50, 51], [*rows[1][:15], 52])):
        fresh = model(torch.tensor([kept])).logits[0, -1]
        torch.testing.assert_close(out.logits[row, -1], fresh, rtol=1e-4, atol=1e-4)
    assert seq.num_slots == 15 + 2  # the last slot, which no row kept, was cropped; row 0's holes stay


@pytest.mark.parametrize("name", ["words", "bpe"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_conversation_continues_from_its_cache(name: str, batch: int) -> None:
    """`cache=` from the previous turn: plain's tokens at every turn (the draft re-reads the whole text)."""
    from transformers import DynamicCache

    target, draft, target_tokenizer, draft_tokenizer = setup(name)
    others = {"assistant": draft, "tokenizer": target_tokenizer, "assistant_tokenizer": draft_tokenizer}

    def conversation(extra: dict) -> list[torch.Tensor]:
        inputs, cache, outputs = _prompts(target_tokenizer, batch), DynamicCache(config=target.config), []
        for _ in range(2):
            out = target.generate(**inputs, max_new_tokens=12, do_sample=False, cache=cache, **extra)
            outputs.append(out)
            ids = torch.cat([out, out[:, -3:]], dim=1)  # the next turn repeats the last three tokens
            mask = torch.cat(
                [inputs["attention_mask"], torch.ones_like(ids[:, inputs["attention_mask"].shape[1] :])], 1
            )
            inputs = {"input_ids": ids, "attention_mask": mask}
        return outputs

    plain, ours = conversation({}), conversation(others)
    assert all(torch.equal(a, b) for a, b in zip(plain, ours, strict=True))
