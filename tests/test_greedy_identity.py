"""Greedy speculative decoding returns exactly plain greedy's tokens, for every row."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_specdec.drafters.vocab import count_tokens, frequent_tokens
from hf_specdec.generation.decisions import SpeculativeCosts, parameter_share
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model, tiny_target

ARCHS = sorted(BUILDERS)
NEW = 40

# Decisions from the tokens alone (measured costs would decide from this machine's timings whether a draft as
# large as the target is worth starting: it is not).
COSTS = SpeculativeCosts(draft_forward=0.1, verify_per_token=0.01)


def _draft(arch: str, kind: str, target):
    if kind == "self":  # everything accepted
        return copy.deepcopy(target)  # a twin: the target itself is refused as its own draft
    if kind == "shallow":  # the target's own first layer: right some of the time
        return tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    return tiny_model(arch, seed=123, sharpen=4.0)  # unrelated: almost everything rejected


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["self", "shallow", "random"])
def test_matches_plain_greedy(arch: str, batch: int, kind: str) -> None:
    target = tiny_target(arch)
    draft = _draft(arch, kind, target)
    ids, mask = ragged_batch(batch, seed=batch)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        assistant=draft,
        num_assistant_tokens=4,
        speculative_costs=COSTS,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    summary = out.speculative.summary()
    if kind == "self":
        assert summary["acceptance_rate"] == 1.0
    if kind == "random":
        assert summary["acceptance_rate"] < 0.5


def test_a_dynamically_quantised_draft_keeps_plain_greedy() -> None:
    """A draft whose linear layers (its lm_head included) are int8 with `torch.ao`'s dynamic quantisation, where
    `weight` is a method: it drafts as any draft does, and the output is plain greedy's."""
    import warnings

    target = tiny_target("llama")
    draft = copy.deepcopy(target)  # its twin: rounded to int8, still right most of the time
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's quantised tensors are deprecated in favour of torchao
        draft = torch.ao.quantization.quantize_dynamic(draft, {torch.nn.Linear}, dtype=torch.qint8)
    assert callable(draft.get_output_embeddings().weight)
    # The first guess of its cost counts the packed int8 weights (`parameters()` leaves them out): its twin's size.
    assert parameter_share(draft, target) == pytest.approx(1.0)
    ids, mask = ragged_batch(3, seed=4)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, assistant=draft,
        speculative_costs=COSTS, return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["acceptance_rate"] > 0.5
    # Its lm_head has no weight tensor to gather a draft vocabulary's rows from: refused, saying why.
    with pytest.raises(ValueError, match=r"draft vocabulary .* gathers rows of the output layer.s weight.*quantised"):
        target.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, assistant=draft, assistant_vocab=torch.tensor([1, 2])
        )


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_rows_stop_at_their_own_eos(arch: str) -> None:
    """Pick as EOS a token that plain greedy emits mid-generation in one row only: that row stops early,
    gets padding afterwards, and the others go on, exactly as in plain decoding."""
    target = tiny_target(arch)
    draft = tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=7)
    free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    generated = free[:, ids.shape[1] :]
    eos = int(generated[0, 1])  # row 0 emits it right away; the others may later, or never
    plain = target.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        assistant=draft,
    )
    assert torch.equal(out, plain)
    assert plain.shape[1] > ids.shape[1] + 2  # some row went on ...
    assert plain[0, ids.shape[1] + 2 :].eq(0).all()  # ... while row 0 stopped and was padded


def test_eos_list_and_max_length() -> None:
    target = tiny_target("qwen2")
    draft = tiny_model("qwen2", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(2, seed=3)
    free = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    eos = [int(free[0, ids.shape[1] + 5]), int(free[1, ids.shape[1] + 9])]
    kwargs = dict(input_ids=ids, attention_mask=mask, do_sample=False, eos_token_id=eos, pad_token_id=0, max_length=30)
    assert torch.equal(target.generate(**kwargs, assistant=draft), target.generate(**kwargs))


@pytest.mark.parametrize(
    "processing",
    [
        {"repetition_penalty": 1.5},
        {"min_new_tokens": 12, "eos_token_id": 5},
        {"no_repeat_ngram_size": 2},
    ],
)
def test_prefix_dependent_processors_keep_identity(processing: dict) -> None:
    """Processors that read the prefix see each row's exact tokens, though rows accept different counts."""
    target = tiny_target("llama")
    draft = tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=11)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0, **processing)
    assert torch.equal(target.generate(**kwargs, assistant=draft), target.generate(**kwargs))


@pytest.mark.parametrize(
    "policy",
    [
        {"num_assistant_tokens": 1},
        {"num_assistant_tokens": 9, "num_assistant_tokens_schedule": "constant"},
        {"num_assistant_tokens": 12, "num_assistant_tokens_schedule": "adaptive"},
        {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "heuristic"},
        {"num_assistant_tokens": 8, "assistant_confidence_threshold": 0.6},
    ],
)
def test_draft_length_policies_keep_identity(policy: dict) -> None:
    target = tiny_target("mistral")
    draft = tiny_model("mistral", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=5)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(target.generate(**kwargs, assistant=draft, **policy), target.generate(**kwargs))


def test_cache_compaction_keeps_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Squeezing holes out of the caches after every step changes nothing but memory."""
    import hf_specdec.generation.kv_cache as kv_cache

    compactions = []
    original = kv_cache.CachedSequence.compact

    def counting(self, width=None):
        compactions.append(self.num_slots)
        original(self, width)

    monkeypatch.setattr(kv_cache, "MIN_WASTE", 0)  # compact after every step
    monkeypatch.setattr(kv_cache, "COMPACT_FRACTION", 0.0)
    monkeypatch.setattr(kv_cache.CachedSequence, "compact", counting)
    target = tiny_target("llama")
    draft = tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=2)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(target.generate(**kwargs, assistant=draft), target.generate(**kwargs))
    assert compactions


def test_drafts_never_run_past_the_model_positions() -> None:
    """A prompt that ends a few tokens before GPT-2's last learned position, and max_length right there:
    drafts past the limit would index past the position table."""
    target, draft = tiny_target("gpt2"), tiny_model("gpt2", seed=0, num_layers=1, sharpen=4.0)
    limit = target.config.n_positions
    ids = torch.randint(4, 90, (2, limit - 5), generator=torch.Generator().manual_seed(0))
    kwargs = dict(input_ids=ids, max_length=limit, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(target.generate(**kwargs, assistant=draft, num_assistant_tokens=8), target.generate(**kwargs))


def test_user_length_and_eos_criteria_are_honoured() -> None:
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import MaxLengthCriteria

    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=1)
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=ids.shape[1] + 5)])
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False, stopping_criteria=criteria)
    plain = target.generate(**kwargs)
    assert plain.shape[1] == ids.shape[1] + 5
    assert torch.equal(target.generate(**kwargs, assistant=draft), plain)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 3])
def test_a_draft_vocabulary_keeps_plain_greedy(arch: str, batch: int) -> None:
    """The draft (the target's twin, so only the vocabulary makes it miss) proposes only the 80% of the
    output's distinct tokens it uses most, through its decoder and those lm_head rows: outputs unchanged,
    most drafts accepted, but not all (some output tokens are outside the vocabulary)."""
    target = tiny_target(arch)
    draft = copy.deepcopy(target)
    ids, mask = ragged_batch(batch, seed=batch)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    counts = count_tokens(plain[:, ids.shape[1] :], plain.max().item() + 1)
    vocab = frequent_tokens(counts, int(0.8 * (counts > 0).sum()))
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        assistant=draft,
        assistant_vocab=vocab,
        num_assistant_tokens=4,
        num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    assert 0.3 < out.speculative.summary()["acceptance_rate"] < 1.0
