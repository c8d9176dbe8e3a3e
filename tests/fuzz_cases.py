"""Strategies, cached models and checks of the differential fuzzer (tests/test_fuzz.py).

A `Case` is everything one `generate()` call needs: an architecture, a ragged batch of prompts, generation
arguments drawn from the whole `GenerationConfig` surface a decoder-only model accepts, fields set on the
model's own generation config, user processors / stopping criteria, and the speculative path's own arguments.
`check` runs plain `generate()` and the speculative path on it and compares them.

Profiles: "ci" (default; derandomized, a few hundred cases over all paths) and "long"
(`HYPOTHESIS_PROFILE=long`: >= 5,000 cases per path, random).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import random
import string
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, event, note, reject, settings
from hypothesis import strategies as st
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
    SynthIDTextWatermarkingConfig,
    WatermarkingConfig,
)
from transformers import logging as transformers_logging

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM
from hf_specdec.bench import quantized
from tests.tiny_models import BOS, EOS, PAD, VOCAB, tiny_model

# ---------------------------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------------------------

CI_EXAMPLES = 50  # per path
_HEALTH = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
# No shrinking in "ci": a failing case is printed as drawn (a `Case(...)` to paste into `@example`), at once.
settings.register_profile(
    "ci",
    max_examples=CI_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=_HEALTH,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
# "long": 5,000 random cases per path, or FUZZ_EXAMPLES.
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "5000")),
    derandomize=False,
    deadline=None,
    database=None,
    suppress_health_check=_HEALTH,
)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ARCHS = ("llama", "qwen2", "mistral", "gpt2")
PATHS = (
    "assistant_poor",
    "assistant_perfect",
    "assistant_tree",
    "lookup",
    "hybrid",
    "early_exit",
    "other_tokenizer",
    "medusa",
    "medusa_dynamic",
    "medusa_lookup",
    "medusa_eagle",
)
MAX_NEW = 24
PADDED_VOCAB = 112  # embedding matrices padded past the tokenizer's 96 tokens

# ---------------------------------------------------------------------------------------------------------
# Models and tokenizer, built once per process
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def target(arch: str) -> PreTrainedModel:
    return hf_specdec.speculative(tiny_model(arch, seed=0, num_layers=2, sharpen=4.0))


def _pad_vocabulary(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """Pad the embedding matrices to PADDED_VOCAB rows; the new rows are scaled copies of real ones, so the
    model does emit ids past the tokenizer's 96 (real padded models rarely do)."""
    model.resize_token_embeddings(PADDED_VOCAB, mean_resizing=False)
    generator = torch.Generator().manual_seed(seed)
    extra = PADDED_VOCAB - VOCAB
    with torch.no_grad():
        for matrix, scale in ((model.get_input_embeddings().weight, 1.0), (model.get_output_embeddings().weight, 1.1)):
            matrix[VOCAB:] = matrix[torch.randperm(VOCAB, generator=generator)[:extra]] * scale
    return model.eval()


@functools.cache
def padded_target(arch: str) -> PreTrainedModel:
    """The target with its vocabulary padded past the tokenizer's: drafted for by a 96-token draft."""
    return hf_specdec.speculative(_pad_vocabulary(tiny_model(arch, seed=0, num_layers=2, sharpen=4.0), seed=7))


@functools.cache
def poor_draft(arch: str, padded: bool = False) -> PreTrainedModel:
    """An unrelated random model of the same vocabulary: most drafts rejected."""
    model = tiny_model(arch, seed=123, num_layers=1, sharpen=4.0)
    return _pad_vocabulary(model, seed=8) if padded else model.eval()


@functools.cache
def perfect_draft(arch: str) -> PreTrainedModel:
    """A separate object with the target's weights: every draft accepted (up to float ties)."""
    return copy.deepcopy(target(arch))


@functools.cache
def int8_draft(arch: str) -> PreTrainedModel:
    """The target with its linear layers in int8 (torch's dynamic quantisation, as a CPU user makes a cheaper
    draft): near the target's guesses, not equal to them."""
    return quantized.int8_draft(target(arch))


@functools.cache
def medusa(arch: str, head_type: str) -> MedusaForCausalLM:
    """Random heads on the target itself (so plain `target(arch).generate()` is the reference)."""
    torch.manual_seed(11)
    share = arch != "gpt2" and head_type != "eagle3"  # EAGLE-3 heads project onto their own draft vocabulary
    config = MedusaConfig(num_heads=3, head_type=head_type, share_lm_head=share)
    return MedusaForCausalLM.from_base(target(arch), config).eval()


# Token strings: specials, then single characters, then a few multi-character tokens (so that a stop string
# can end inside a token, or span two).
_MULTI = ["ab", "ba", "the", "he", "an", "in", "er", "on", "at", "en", "abc", "xy"]
_CHARS = list(string.ascii_letters + string.digits + "!#$%&()*+,-./:;<=>?@[]^_{|}~")
TOKEN_STRINGS = ["<pad>", "<s>", "<unk>", "</s>", *(_CHARS + _MULTI)[: VOCAB - 4]]
assert len(TOKEN_STRINGS) == VOCAB and len(set(TOKEN_STRINGS)) == VOCAB


# A draft vocabulary of the same strings under other ids (the special tokens keep theirs): draft id d spells
# TOKEN_STRINGS[_OTHER_ORDER[d]].
_OTHER_ORDER = [0, 1, 2, 3, *random.Random(5).sample(range(4, VOCAB), VOCAB - 4)]


@functools.cache
def other_vocabulary_draft(arch: str, perfect: bool) -> PreTrainedModel:
    """A draft over `other_tokenizer()`'s ids: the target itself (perfect) or an unrelated random model, its
    embedding and output rows moved to the other ids."""
    model = copy.deepcopy(target(arch)) if perfect else tiny_model(arch, seed=321, num_layers=1, sharpen=4.0)
    order = torch.tensor(_OTHER_ORDER)
    with torch.no_grad():
        embeddings, output = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        tied = embeddings.data_ptr() == output.data_ptr()
        embeddings.copy_(embeddings[order].clone())
        if not tied:
            output.copy_(output[order].clone())
    return model.eval()


@functools.cache
def other_tokenizer() -> PreTrainedTokenizerFast:
    """`tokenizer()`'s strings under the draft's ids (`_OTHER_ORDER`)."""
    return _char_tokenizer({TOKEN_STRINGS[t]: d for d, t in enumerate(_OTHER_ORDER)})


@functools.cache
def tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer over the 96 ids of the tiny models (no download)."""
    return _char_tokenizer({token: i for i, token in enumerate(TOKEN_STRINGS)})


def _char_tokenizer(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@functools.cache
def frequent_tokens(arch: str) -> tuple[int, ...]:
    """Tokens plain greedy decoding of `arch` emits, most frequent first: EOS ids, bad words and stop strings
    drawn from these are actually hit."""
    model = target(arch)
    ids = torch.randint(4, VOCAB, (6, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    counts = torch.bincount(out[:, ids.shape[1] :].reshape(-1), minlength=VOCAB)
    order = counts.argsort(descending=True)
    return tuple(int(t) for t in order[counts[order] > 0].tolist())


# ---------------------------------------------------------------------------------------------------------
# User processors and stopping criteria (fresh objects per call: some keep state)
# ---------------------------------------------------------------------------------------------------------


class NoImmediateRepeat(LogitsProcessor):
    """A user processor that reads the prefix: never the previous token again."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))

    def __repr__(self) -> str:
        return "NoImmediateRepeat()"


class StopOnTokens(StoppingCriteria):
    """A user criterion: a row is done once its last token is one of `ids`."""

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids = torch.tensor(ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.isin(input_ids[:, -1], self.ids.to(input_ids.device))

    def __repr__(self) -> str:
        return f"StopOnTokens({tuple(self.ids.tolist())})"


def allowed_after(last: int) -> list[int]:
    """`prefix_allowed_tokens_fn`'s rule: after an even token only ids = last (mod 3), after an odd one all."""
    if last % 2:
        return list(range(VOCAB))
    return [t for t in range(VOCAB) if t % 3 == last % 3]


def prefix_fn(prompt_length: int) -> Any:
    """`prefix_allowed_tokens_fn`: `allowed_after` the last token; it raises when called on a prefix plain
    decoding cannot produce (a generated token its rule forbade), as a user's parser of the prefix may."""

    def allowed(batch_id: int, input_ids: torch.Tensor) -> list[int]:
        row = input_ids.tolist()
        for a in range(max(prompt_length, 1), len(row)):
            padding = len(set(row[a:])) == 1  # a finished row: padding from here on
            if row[a] not in allowed_after(row[a - 1]) and not padding:
                raise RuntimeError(f"prefix_allowed_tokens_fn called on an impossible prefix: {row}")
        return allowed_after(row[-1])

    return allowed


# ---------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    arch: str
    prompts: list[list[int]]  # real tokens per row; left-padded with PAD
    gen: dict[str, Any]  # generate()'s generation arguments (explicit None included)
    defaults: dict[str, Any] = field(default_factory=dict)  # set on model.generation_config for the call
    path_kwargs: dict[str, Any] = field(default_factory=dict)  # the speculative path's own arguments
    mask: str = "mask"  # "mask": an attention mask; "none": no mask (all rows the same length)
    draft: str = "poor"  # assistant paths: poor | perfect | padded_draft | padded_target | int8
    draft_arch: str = "llama"
    head_type: str = "medusa"
    processor: bool = False  # NoImmediateRepeat as a user logits processor
    prefix_fn: bool = False  # prefix_allowed_tokens_fn=prefix_fn(prompt length)
    stop_on: tuple[int, ...] = ()  # StopOnTokens criterion
    tokenizer: bool = False  # pass tokenizer= (always with stop_strings)
    via_config: bool = False  # pass the generation arguments as a GenerationConfig
    seed: int = 0


def _ids(arch: str) -> st.SearchStrategy[int]:
    freq = frequent_tokens(arch)
    return st.one_of(
        st.sampled_from(freq[:8]), st.sampled_from(freq), st.integers(0, VOCAB - 1), st.sampled_from((EOS, PAD, BOS))
    )


@st.composite
def _prompts(draw: st.DrawFn, repetitive: bool) -> list[list[int]]:
    batch = draw(st.integers(1, 5))
    rows = []
    for _ in range(batch):
        length = draw(st.integers(1, 40))
        if repetitive or draw(st.booleans()):
            # Built from a short motif with a few edits: prompt lookup finds matches.
            motif = draw(st.lists(st.integers(4, VOCAB - 1), min_size=1, max_size=6))
            row = (motif * (length // len(motif) + 1))[:length]
            for _ in range(draw(st.integers(0, 2))):
                row[draw(st.integers(0, length - 1))] = draw(st.integers(2, VOCAB - 1))
        else:
            row = draw(st.lists(st.integers(2, VOCAB - 1), min_size=length, max_size=length))
        rows.append(row)
    return rows


def _token_lists(ids: st.SearchStrategy[int], max_size: int = 3) -> st.SearchStrategy[list[int]]:
    return st.lists(ids, min_size=1, max_size=max_size, unique=True)


@st.composite
def _generation_args(draw: st.DrawFn, arch: str, prompt_length: int) -> dict[str, Any]:
    ids = _ids(arch)
    gen: dict[str, Any] = {}
    # Lengths: max_new_tokens, max_length (sometimes below the prompt), both, or neither (the default 20).
    mode = draw(st.sampled_from(["new", "new", "new", "length", "both", "neither"]))
    if mode in ("new", "both"):
        gen["max_new_tokens"] = draw(st.integers(1, MAX_NEW))
    if mode in ("length", "both"):
        gen["max_length"] = prompt_length + draw(st.integers(-3, MAX_NEW))
    if draw(st.integers(0, 3)) == 0:
        gen["min_new_tokens"] = draw(st.integers(0, MAX_NEW))
    if draw(st.integers(0, 5)) == 0:
        gen["min_length"] = prompt_length + draw(st.integers(-2, MAX_NEW))
    # Special tokens: absent (model default), explicit None, one id, several.
    eos = st.one_of(st.none(), ids, _token_lists(ids))
    if draw(st.integers(0, 2)) == 0:
        gen["eos_token_id"] = draw(eos)
    if draw(st.integers(0, 3)) == 0:
        gen["pad_token_id"] = draw(st.one_of(st.none(), st.just(PAD), ids))
    # Processors.
    if draw(st.integers(0, 3)) == 0:
        gen["repetition_penalty"] = draw(st.sampled_from([0.7, 1.0, 1.3, 2.0]))
    if draw(st.integers(0, 4)) == 0:
        gen["no_repeat_ngram_size"] = draw(st.integers(1, 4))
    if draw(st.integers(0, 4)) == 0:
        gen["bad_words_ids"] = draw(st.lists(_token_lists(ids), min_size=1, max_size=3))
    if draw(st.integers(0, 5)) == 0:
        keys = st.lists(ids, min_size=1, max_size=2).map(tuple)
        gen["sequence_bias"] = draw(st.dictionaries(keys, st.sampled_from([-10.0, -2.0, 3.0, 10.0]), min_size=1))
    if draw(st.integers(0, 6)) == 0:
        gen["forced_eos_token_id"] = draw(st.one_of(ids, _token_lists(ids, 2)))
    if draw(st.integers(0, 8)) == 0:
        gen["forced_bos_token_id"] = draw(ids)
    if draw(st.integers(0, 4)) == 0:
        gen["suppress_tokens"] = draw(_token_lists(ids, 4))
    if draw(st.integers(0, 5)) == 0:
        gen["begin_suppress_tokens"] = draw(_token_lists(ids, 4))
    if draw(st.integers(0, 6)) == 0:
        gen["exponential_decay_length_penalty"] = (draw(st.integers(0, 10)), draw(st.sampled_from([1.05, 1.5, 3.0])))
    if draw(st.integers(0, 8)) == 0:
        gen["remove_invalid_values"] = True
    if draw(st.integers(0, 12)) == 0:
        gen["watermarking_config"] = draw(
            st.one_of(
                st.builds(
                    WatermarkingConfig,
                    greenlist_ratio=st.sampled_from([0.25, 0.5]),
                    bias=st.sampled_from([2.0, 8.0]),
                    seeding_scheme=st.sampled_from(["lefthash", "selfhash"]),
                    context_width=st.integers(1, 3),
                ),
                st.builds(SynthIDTextWatermarkingConfig, keys=st.just([11, 12, 13, 14]), ngram_len=st.integers(2, 4)),
            )
        )
    if draw(st.integers(0, 6)) == 0:
        gen["renormalize_logits"] = True
    # Decoding: greedy (absent or False) or sampling, with warpers either way.
    do_sample = draw(st.sampled_from([None, False, False, True, True]))
    if do_sample is not None:
        gen["do_sample"] = do_sample
    warpers = {
        "temperature": st.sampled_from([0.3, 0.7, 1.0, 1.5]),
        "top_k": st.sampled_from([None, 0, 1, 1, 1, 2, 5, 20]),
        "top_p": st.sampled_from([0.1, 0.5, 0.9, 1.0]),
        "min_p": st.sampled_from([0.0, 0.05, 0.3]),
        "typical_p": st.sampled_from([0.2, 0.9, 1.0]),
        "epsilon_cutoff": st.sampled_from([1e-4, 3e-2]),
        "eta_cutoff": st.sampled_from([1e-4, 3e-2]),
        "top_h": st.sampled_from([0.3, 0.9]),
    }
    for name, values in warpers.items():
        if draw(st.integers(0, 4 if do_sample else 9)) == 0:
            gen[name] = draw(values)
    if draw(st.integers(0, 4)) == 0:
        gen["num_return_sequences"] = draw(st.integers(1, 3))
    # Outputs.
    if draw(st.booleans()):
        gen["return_dict_in_generate"] = True
        if draw(st.booleans()):
            gen["output_scores"] = True
        if draw(st.booleans()):
            gen["output_logits"] = True
    if draw(st.integers(0, 5)) == 0:
        text = TOKEN_STRINGS[draw(st.sampled_from(frequent_tokens(arch)[:12]))]
        text += draw(st.sampled_from(["", "", TOKEN_STRINGS[draw(ids)] if draw(ids) >= 4 else ""]))
        gen["stop_strings"] = draw(st.sampled_from([text, [text, "zz"]]))
    return gen


def _common_ids(arch: str) -> st.SearchStrategy[int]:
    return st.sampled_from(frequent_tokens(arch)[:4])


# Fields a model's generation config may set (and a call may override), with their values.
GENERATION_DEFAULTS: dict[str, Any] = {
    "eos_token_id": lambda arch: st.one_of(_common_ids(arch), _token_lists(_common_ids(arch), 2)),
    "pad_token_id": lambda arch: st.one_of(st.just(PAD), _common_ids(arch)),
    "top_k": lambda arch: st.sampled_from([1, 5]),
    "do_sample": lambda arch: st.booleans(),
    "temperature": lambda arch: st.sampled_from([0.5, 2.0]),
    "max_new_tokens": lambda arch: st.integers(1, MAX_NEW),
    "min_new_tokens": lambda arch: st.integers(1, 8),
    "repetition_penalty": lambda arch: st.sampled_from([1.2, 0.8]),
    "no_repeat_ngram_size": lambda arch: st.integers(1, 3),
    "suppress_tokens": lambda arch: _token_lists(_common_ids(arch)),
}


@st.composite
def _model_defaults(draw: st.DrawFn, arch: str) -> dict[str, Any]:
    """Fields set on `model.generation_config` that the call may then override (with a value or None)."""
    if draw(st.integers(0, 2)) != 0:
        return {}
    options = dict(GENERATION_DEFAULTS)
    options["num_assistant_tokens"] = lambda arch: st.integers(1, 6)
    chosen = draw(st.lists(st.sampled_from(sorted(options)), min_size=1, max_size=4, unique=True))
    return {name: draw(options[name](arch)) for name in chosen}


@st.composite
def cases(draw: st.DrawFn, path: str) -> Case:
    arch = draw(st.sampled_from(ARCHS))
    prompts = draw(_prompts(repetitive=path in ("lookup", "hybrid", "medusa_lookup") and draw(st.booleans())))
    prompt_length = max(len(p) for p in prompts)
    gen = draw(_generation_args(arch, prompt_length))
    defaults = draw(_model_defaults(arch))
    for name in defaults:
        if name in GENERATION_DEFAULTS:
            choice = draw(st.sampled_from(["keep", "none", "other"]))
            if choice == "none":
                gen[name] = None  # an explicit None: plain generate() then has no such setting
            elif choice == "other":
                gen[name] = draw(GENERATION_DEFAULTS[name](arch))
    case = Case(arch=arch, prompts=prompts, gen=gen, defaults=defaults)
    if len({len(p) for p in prompts}) == 1 and draw(st.booleans()):
        case.mask = "none"
    case.processor = draw(st.integers(0, 7)) == 0
    case.prefix_fn = draw(st.integers(0, 9)) == 0
    if draw(st.integers(0, 6)) == 0:
        case.stop_on = tuple(draw(_token_lists(_ids(arch), 2)))
    case.tokenizer = "stop_strings" in gen or draw(st.integers(0, 9)) == 0
    case.via_config = draw(st.integers(0, 11)) == 0
    case.seed = draw(st.integers(0, 2**16))
    kw = case.path_kwargs
    if path == "early_exit":  # the target's first layer drafts
        kw["assistant_early_exit"] = 1
        if draw(st.booleans()):
            kw["num_assistant_tokens"] = draw(st.integers(1, 10))
        if draw(st.booleans()):
            kw["num_assistant_tokens_schedule"] = draw(st.sampled_from(["constant", "adaptive", "heuristic"]))
    if path == "other_tokenizer":  # a draft of another vocabulary, drafting through text
        case.draft = draw(st.sampled_from(["other_perfect", "other_poor"]))
        if draw(st.booleans()):
            kw["num_assistant_tokens"] = draw(st.integers(1, 10))
        if draw(st.booleans()):
            kw["num_assistant_tokens_schedule"] = draw(st.sampled_from(["constant", "adaptive", "heuristic"]))
    if path.startswith("assistant") or path == "hybrid":
        case.draft = (
            "perfect"
            if path == "assistant_perfect"
            else draw(st.sampled_from(["poor"] * 6 + ["padded_draft", "padded_target", "int8", "int8"]))
        )
        case.draft_arch = draw(st.sampled_from(ARCHS)) if case.draft.startswith("poor") else arch
        if path == "assistant_tree":  # a draft model growing a tree: the tree sets the shape, not the chain settings
            if draw(st.booleans()):
                case.draft, case.draft_arch = "perfect", arch
            depth, top_k = draw(st.integers(1, 5)), draw(st.integers(1, 3))
            most = top_k + (depth - 1) * top_k**2
            kw["tree"] = draw(
                st.one_of(
                    st.integers(1, 12),
                    st.builds(DynamicTree, num_nodes=st.integers(1, most), depth=st.just(depth), top_k=st.just(top_k)),
                )
            )
            return case
        if draw(st.booleans()):
            kw["num_assistant_tokens"] = draw(st.integers(1, 10))
        if draw(st.booleans()):
            kw["num_assistant_tokens_schedule"] = draw(st.sampled_from(["constant", "adaptive", "heuristic"]))
        if draw(st.integers(0, 4)) == 0:
            kw["assistant_confidence_threshold"] = draw(st.sampled_from([0.1, 0.5, 0.9]))
    if path in ("lookup", "hybrid", "medusa_lookup") or (path == "medusa_eagle" and draw(st.booleans())):
        kw["prompt_lookup_num_tokens"] = draw(st.integers(1, 10))
        if draw(st.booleans()):
            kw["max_matching_ngram_size"] = draw(st.integers(1, 4))
        if path != "hybrid" and draw(st.booleans()):
            kw["num_assistant_tokens_schedule"] = draw(st.sampled_from(["constant", "adaptive"]))
    if path == "medusa_eagle":  # EAGLE and EAGLE-3 heads always grow their trees, as deep as asked
        case.head_type = draw(st.sampled_from(["eagle", "eagle3"]))
        kw["medusa"] = True
        depth, top_k = draw(st.one_of(st.none(), st.integers(1, 5))), draw(st.integers(1, 4))
        most = top_k + ((depth or 3) - 1) * top_k**2
        tree = draw(
            st.one_of(
                st.none(),
                st.just("dynamic"),
                st.integers(1, 16),
                st.builds(DynamicTree, num_nodes=st.integers(1, most), depth=st.just(depth), top_k=st.just(top_k)),
            )
        )
        if tree is not None:
            kw["tree"] = tree
    elif path.startswith("medusa"):
        case.head_type = draw(st.sampled_from(["medusa", "recurrent"]))
        kw["medusa"] = True
        if path == "medusa_dynamic":
            depth = draw(st.one_of(st.none(), st.integers(1, 3 if case.head_type == "medusa" else 5)))
            top_k = draw(st.integers(1, 4))
            most = top_k * (depth or 3)
            kw["tree"] = draw(
                st.one_of(
                    st.just("dynamic"),
                    st.builds(DynamicTree, num_nodes=st.integers(1, most), depth=st.just(depth), top_k=st.just(top_k)),
                )
            )
        else:
            trees = [st.none(), st.sampled_from(["chain", "small", "medium"]), st.integers(1, 10)]
            trees.append(st.sampled_from([[[0]], [[0], [1], [0, 0]], [[0], [0, 0], [0, 0, 0], [1], [2], [0, 1]]]))
            tree = draw(st.one_of(*trees))
            if tree is not None:
                kw["tree"] = tree
    return case


# Divergences a differential run once found (since fixed), kept as explicit examples on every path. On the llama target,
# plain greedy from these prompts emits token 94 (string "{") in both rows, at different steps.
_PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12]]
_PATH_KWARGS: dict[str, dict[str, Any]] = {
    "assistant_poor": {},
    "assistant_perfect": {},
    "assistant_tree": {"tree": 4},
    "lookup": {"prompt_lookup_num_tokens": 3},
    "hybrid": {"prompt_lookup_num_tokens": 3},
    "early_exit": {"assistant_early_exit": 1},
    "other_tokenizer": {},
    "medusa": {"medusa": True},
    "medusa_dynamic": {"medusa": True, "tree": "dynamic"},
    "medusa_lookup": {"medusa": True, "prompt_lookup_num_tokens": 3},
    "medusa_eagle": {"medusa": True},
}


def known_divergences(path: str) -> list[Case]:
    kw = _PATH_KWARGS[path]
    draft = "perfect" if path == "assistant_perfect" else "poor"
    heads = {"head_type": "eagle3"} if path == "medusa_eagle" else {}
    greedy = {"max_new_tokens": 12, "do_sample": False}
    cases = [
        # An explicit None (eos / pad / top_k) replaced by the model's default.
        Case("llama", _PROMPTS, {**greedy, "eos_token_id": None}, {"eos_token_id": 94}, dict(kw), draft=draft, **heads),
        Case(
            "llama",
            _PROMPTS,
            {**greedy, "pad_token_id": None},
            {"eos_token_id": 94, "pad_token_id": 7},
            dict(kw),
            **heads,
            draft=draft,
        ),
        Case(
            "llama",
            _PROMPTS,
            {"max_new_tokens": 4, "top_k": None, "return_dict_in_generate": True, "output_scores": True},
            {"do_sample": True, "top_k": 1},
            dict(kw),
            **heads,
            draft=draft,
        ),
        # stop_strings (Medusa: "could not locate a tokenizer").
        Case(
            "llama",
            _PROMPTS,
            {**greedy, "stop_strings": TOKEN_STRINGS[94]},
            {},
            dict(kw),
            **heads,
            draft=draft,
            tokenizer=True,
        ),
        # No EOS id: a row a custom criterion stopped goes on (plain pads only with an EOS criterion).
        Case(
            "llama",
            _PROMPTS,
            {**greedy, "eos_token_id": None, "pad_token_id": 0},
            {},
            dict(kw),
            **heads,
            draft=draft,
            stop_on=(94,),
        ),
    ]
    # Scores of a row that is not scored at a step's prefix length, whose committed tokens then padding (a
    # banned pad id) made a prefix-reading processor ban every token and the eta warper fail on it.
    banned_pad = {
        "max_new_tokens": 3, "min_length": 31, "eos_token_id": None, "pad_token_id": 26, "repetition_penalty": 0.7,
        "bad_words_ids": [[26]], "sequence_bias": {(26,): -10.0}, "forced_eos_token_id": 26,
        "forced_bos_token_id": 26, "exponential_decay_length_penalty": (0, 1.05), "renormalize_logits": True,
        "do_sample": True, "top_k": 1, "top_p": 0.1, "typical_p": 0.2, "eta_cutoff": 0.0001,
    }  # fmt: skip
    cases.append(
        Case(
            "llama",
            [[2] * 31, [8]],
            banned_pad,
            {},
            dict(kw),
            **heads,
            draft="other_perfect" if path == "other_tokenizer" else draft,
            processor=True,
            prefix_fn=True,
            tokenizer=True,
            via_config=True,
        )
    )
    if path in ("assistant_poor", "hybrid"):
        # A draft whose embedding matrix is smaller than the target's logits.
        cases.append(
            Case("llama", _PROMPTS, dict(greedy), {}, dict(kw), **heads, draft="padded_target", draft_arch="llama")
        )
    return cases


# ---------------------------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------------------------


def inputs(case: Case) -> dict[str, torch.Tensor]:
    width = max(len(p) for p in case.prompts)
    ids = torch.full((len(case.prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(case.prompts):
        ids[b, width - len(row) :] = torch.tensor(row)
        mask[b, width - len(row) :] = 1
    return {"input_ids": ids} if case.mask == "none" else {"input_ids": ids, "attention_mask": mask}


def plain_model(case: Case) -> PreTrainedModel:
    return padded_target(case.arch) if case.draft == "padded_target" else target(case.arch)


def common_kwargs(case: Case) -> dict[str, Any]:
    """What plain and speculative calls both get: generation arguments, user processors and criteria."""
    kwargs: dict[str, Any] = dict(case.gen)
    if case.via_config:
        try:
            with quiet():
                kwargs = {"generation_config": GenerationConfig(**kwargs)}
        except ValueError:
            reject()  # transformers' own validation refuses these arguments
    if case.processor:
        kwargs["logits_processor"] = LogitsProcessorList([NoImmediateRepeat()])
    if case.prefix_fn:
        kwargs["prefix_allowed_tokens_fn"] = prefix_fn(max(len(p) for p in case.prompts))
    if case.stop_on:
        kwargs["stopping_criteria"] = StoppingCriteriaList([StopOnTokens(case.stop_on)])
    if case.tokenizer:
        kwargs["tokenizer"] = tokenizer()
    return kwargs


def path_call(case: Case, path: str) -> tuple[Any, dict[str, Any]]:
    """The model whose generate() runs the path, and the path's own arguments."""
    kw = dict(case.path_kwargs)
    if path.startswith("medusa"):
        return medusa(case.arch, case.head_type), kw
    if path == "other_tokenizer":
        kw["assistant"] = other_vocabulary_draft(case.arch, case.draft == "other_perfect")
        kw["tokenizer"], kw["assistant_tokenizer"] = tokenizer(), other_tokenizer()
    if path.startswith("assistant") or path == "hybrid":
        if case.draft == "perfect":
            kw["assistant"] = perfect_draft(case.arch)
        elif case.draft == "int8":
            kw["assistant"] = int8_draft(case.arch)
        else:
            kw["assistant"] = poor_draft(case.draft_arch, padded=case.draft == "padded_draft")
        if case.draft in ("padded_draft", "padded_target"):
            kw["tokenizer"] = kw["assistant_tokenizer"] = tokenizer()
    return plain_model(case), kw


@contextlib.contextmanager
def model_defaults(model: PreTrainedModel, defaults: dict[str, Any]) -> Iterator[None]:
    saved = copy.deepcopy(model.generation_config)
    try:
        for name, value in defaults.items():
            setattr(model.generation_config, name, value)
        yield
    finally:
        model.generation_config = saved


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Transformers' warnings about the drawn arguments (thousands of them) are not what is tested."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers_logging.set_verbosity(verbosity)


def attempt(model: Any, seed: int, **kwargs: Any) -> Outcome:
    torch.manual_seed(seed)
    try:
        with torch.no_grad(), quiet():
            return Outcome(value=model.generate(**kwargs))
    except Exception as error:
        return Outcome(error=error)


# What a path documents it refuses (docs/refusals.md): argument -> path prefixes. None at present: every path
# returns scores and logits.
DOCUMENTED_REFUSALS: dict[str, tuple[str, ...]] = {}


def expected_refusals(case: Case, path: str) -> list[str]:
    """The arguments of `case` that `path` documents it refuses (the error must name one)."""
    names = [
        name
        for name, paths in DOCUMENTED_REFUSALS.items()
        if case.gen.get(name) and any(path.startswith(p) for p in paths)
    ]
    # SynthID text watermarking counts its calls: refused on every path (docs/usage.md, generation/processing.py).
    if isinstance(case.gen.get("watermarking_config"), SynthIDTextWatermarkingConfig):
        names.append("watermarking_config")
    return names


# ---------------------------------------------------------------------------------------------------------
# What plain decoding decides (from transformers' own preparation of the call)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Rules:
    prompt_length: int
    num_return: int
    max_total: int
    min_new: int
    eos: list[int]
    pad: int | None
    do_sample: bool
    deterministic: bool
    config: GenerationConfig


def plain_rules(case: Case, model: PreTrainedModel, kwargs: dict[str, Any], ids: torch.Tensor) -> Rules:
    """The effective settings of plain `generate()` for `kwargs`, as its own preparation computes them (to be
    called inside `model_defaults`)."""
    kwargs = dict(kwargs)
    given = kwargs.pop("generation_config", None)
    has_default_max_length = (
        kwargs.get("max_length") is None
        and (given is None or given.max_length is None)
        and model.generation_config.max_length is None
    )
    has_default_min_length = (
        kwargs.get("min_length") is None
        and (given is None or given.min_length is None)
        and model.generation_config.min_length is None
    )
    prompt_length = ids.shape[1]
    with quiet():
        config, _ = model._prepare_generation_config(given, **kwargs)
        model._prepare_special_tokens(config, case.mask != "none", device=torch.device("cpu"))
        config = model._prepare_generated_length(
            config, has_default_max_length, has_default_min_length, "input_ids", prompt_length, ids
        )
    min_new = max((config.min_length or 0) - prompt_length, config.min_new_tokens or 0)
    eos = [] if config._eos_token_tensor is None else config._eos_token_tensor.reshape(-1).tolist()
    pad = None if config._pad_token_tensor is None else int(config._pad_token_tensor)
    do_sample = bool(config.do_sample)
    return Rules(
        prompt_length=prompt_length,
        num_return=config.num_return_sequences or 1,
        max_total=max(config.max_length, prompt_length + 1),
        min_new=min_new,
        eos=eos,
        pad=pad,
        do_sample=do_sample,
        # top_k=1 leaves one token, unless forced EOS ids tie (all at 0, the rest -inf): then it samples among them.
        deterministic=not do_sample or (config.top_k == 1 and not isinstance(config.forced_eos_token_id, list)),
        config=config,
    )


def plain_mask(rules: Rules, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The attention mask plain `generate()` uses: the one passed, or without one, transformers takes every
    `pad_token_id` token for padding (unless the pad id is an EOS id); `None` when every token is real."""
    mask = batch.get("attention_mask")
    if mask is None and rules.pad is not None and rules.pad not in rules.eos:
        mask = (batch["input_ids"] != rules.pad).long()
    return mask


def padding_only_rows(rules: Rules, batch: dict[str, torch.Tensor]) -> bool:
    """Whether some row is padding only in the attention mask plain `generate()` uses."""
    mask = plain_mask(rules, batch)
    return mask is not None and bool((~mask.bool()).all(dim=1).any())


def padding_at_end(rules: Rules, batch: dict[str, torch.Tensor]) -> bool:
    """Whether some row ends with padding in the attention mask plain `generate()` uses (without a mask passed, a
    prompt whose last token is `pad_token_id`): plain `generate()` warns and goes on, the library refuses."""
    mask = plain_mask(rules, batch)
    return mask is not None and bool((~mask[:, -1].bool()).any())


def padding_inside(case: Case, rules: Rules, batch: dict[str, torch.Tensor]) -> bool:
    """Whether the attention mask plain `generate()` uses has padding after a real token in some row."""
    mask = plain_mask(rules, batch)
    if mask is None:
        return False
    return bool((mask[:, :-1].bool() & ~mask[:, 1:].bool()).any()) and case.arch == "mistral"


def numerical(error: BaseException) -> bool:
    """A failure of sampling from scores every token of which some processor banned (nan probabilities)."""
    text = str(error)
    return "nan" in text or "inf" in text or "probability tensor" in text


# ---------------------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------------------


def _parts(value: Any) -> tuple[torch.Tensor, tuple | None, tuple | None]:
    if isinstance(value, torch.Tensor):
        return value, None, None
    return value.sequences, getattr(value, "scores", None), getattr(value, "logits", None)


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} (ours) vs {tuple(b.shape)} (plain)"
    rows, cols = (a != b).nonzero(as_tuple=True)
    return (
        f"first difference at row {int(rows[0])}, column {int(cols[0])}: {a[rows[0]].tolist()} vs {b[rows[0]].tolist()}"
    )


def row_ends(sequences: torch.Tensor, rules: Rules, trailing_pad: bool = False) -> list[int]:
    """Per row, how many generated tokens come before padding: up to and including the first EOS, else all.
    `trailing_pad`: a stop string or criterion may have ended a row, padded after: a trailing run of padding
    ends the row too (a row that generated padding tokens itself is then checked less far, never wrongly)."""
    generated = sequences[:, rules.prompt_length :]
    ends = []
    for row in generated.tolist():
        hits = [i for i, t in enumerate(row) if t in rules.eos]
        end = hits[0] + 1 if hits else len(row)
        if trailing_pad and rules.pad is not None:
            while end > 0 and row[end - 1] == rules.pad:
                end -= 1
        ends.append(end)
    return ends


def compare_deterministic(ours: Any, plain: Any, rules: Rules, case: Case) -> None:
    seq, scores, logits = _parts(ours)
    plain_seq, plain_scores, plain_logits = _parts(plain)
    assert seq.shape == plain_seq.shape and torch.equal(seq, plain_seq), (
        "sequences differ from plain generate(): " + _first_difference(seq, plain_seq)
    )
    assert type(ours) is torch.Tensor or not isinstance(plain, torch.Tensor), (
        "a dict output where plain returns a tensor"
    )
    if isinstance(plain, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"plain returns a tensor, ours {type(ours).__name__}"
        return
    ends = row_ends(plain_seq, rules)
    other_stops = bool(case.stop_on or "stop_strings" in case.gen or rules.config.stop_strings)
    for name, mine, theirs in (("scores", scores, plain_scores), ("logits", logits, plain_logits)):
        assert (mine is None) == (theirs is None), f"{name}: ours {'None' if mine is None else 'given'}, plain not"
        if theirs is None:
            continue
        assert len(mine) == len(theirs), f"{name}: {len(mine)} positions, plain {len(theirs)}"
        for t, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert a.shape == b.shape, f"{name}[{t}]: shape {tuple(a.shape)} vs plain {tuple(b.shape)}"
        stacked = torch.stack(mine, 1)  # (rows, positions, vocab)
        reference = torch.stack(theirs, 1)
        for r in range(stacked.shape[0]):
            recorded = (stacked[r] != 0).any(-1)  # positions ours scored for this row
            n = int(recorded.sum())
            assert bool(recorded[:n].all()), f"{name}: row {r} has unscored positions among scored ones"
            least = 1 if other_stops else ends[r]  # a stop string or criterion may end a row earlier
            assert n >= min(least, len(mine)), f"{name}: row {r} scored {n} positions, it generated {ends[r]}"
            assert torch.allclose(stacked[r, :n], reference[r, :n], atol=1e-4, rtol=1e-4, equal_nan=True), (
                f"{name}: row {r} differs from plain at its generated positions: max diff "
                f"{(stacked[r, :n] - reference[r, :n]).nan_to_num(0, 0, 0).abs().max()}"
            )


def violations(sequences: torch.Tensor, rules: Rules, case: Case, ids: torch.Tensor) -> set[str]:
    """What plain decoding guarantees for every output, whatever is sampled; the names of broken rules."""
    broken: set[str] = set()
    p, width = rules.prompt_length, sequences.shape[1]
    config = rules.config
    if sequences.shape[0] != ids.shape[0] * rules.num_return:
        broken.add(f"rows: {sequences.shape[0]}, expected {ids.shape[0]} x {rules.num_return}")
        return broken
    if not p < width <= rules.max_total:
        broken.add(f"length: {width - p} new tokens, at most {rules.max_total - p}")
    if not torch.equal(sequences[:, :p], ids.repeat_interleave(rules.num_return, 0)):
        broken.add("prompt changed")
    stops = bool(case.stop_on or config.stop_strings)
    ends = row_ends(sequences, rules, trailing_pad=stops)
    generated = sequences[:, p:]
    forced_eos = config.forced_eos_token_id
    forced = [] if forced_eos is None else [forced_eos] if isinstance(forced_eos, int) else list(forced_eos)
    last = rules.max_total - p - 1  # where forced EOS overrides everything

    def exempt(t: int, token: int) -> bool:
        return t == last and token in forced

    def nothing_allowed(t: int, row: list[int]) -> bool:
        """At the forced-EOS position, the user processor (it runs after transformers' own, ForcedEOS included)
        bans every forced token when the previous token is one: every token is banned there, and what is drawn
        (`remove_invalid_values` makes the scores uniform) follows no rule, in plain decoding as in ours."""
        return t == last and case.processor and bool(forced) and all(f == row[p + t - 1] for f in forced)

    rows_ended = all(any(t in rules.eos for t in g) for g in generated.tolist())
    if not stops and width < rules.max_total and not rows_ended:
        broken.add("stopped early: a row without EOS, and the length limit not reached")
    bad_single = {w[0] for w in (config.bad_words_ids or []) if len(w) == 1} - set(rules.eos)
    bad_multi = [w for w in (config.bad_words_ids or []) if len(w) > 1]
    suppress = set(config.suppress_tokens or [])
    begin_suppress = set(config.begin_suppress_tokens or [])
    begin = p if (p > 1 or config.forced_bos_token_id is None) else p + 1
    n = config.no_repeat_ngram_size or 0
    for r, end in enumerate(ends):
        row = sequences[r].tolist()
        tail = row[p + end :]
        if end < len(generated[r]) and rules.pad is not None and any(t != rules.pad for t in tail):
            broken.add("tokens after EOS other than padding")
        hit_eos = end > 0 and row[p + end - 1] in rules.eos
        too_early = end < min(rules.min_new, rules.max_total - p) and not exempt(end - 1, row[p + end - 1])
        if hit_eos and too_early and not (stops and rules.pad in rules.eos):
            broken.add(f"EOS after {end} new tokens, before min {rules.min_new}")
        for t in range(end):
            a = p + t
            token = row[a]
            if exempt(t, token) or nothing_allowed(t, row):
                continue
            if token in suppress:
                broken.add("suppressed token")
            if a == begin and token in begin_suppress:
                broken.add("begin-suppressed token")
            if token in bad_single:
                broken.add("bad word (one token)")
            if any(row[a - len(w) + 1 : a + 1] == list(w) for w in bad_multi if a - len(w) + 1 >= 0):
                broken.add("bad word (several tokens)")
            if n and a - n + 1 >= 0:
                gram = row[a - n + 1 : a + 1]
                if any(row[s - n + 1 : s + 1] == gram for s in range(n - 1, a)):
                    broken.add(f"repeated {n}-gram")
            if case.prefix_fn and a >= 1 and token not in allowed_after(row[a - 1]):
                broken.add("prefix_allowed_tokens_fn")
            if case.processor and a >= 1 and token == row[a - 1]:
                broken.add("user processor (NoImmediateRepeat)")
    return broken


def check(case: Case, path: str) -> None:
    """Run plain generate() and `path` on `case`, and compare."""
    base = plain_model(case)
    runner, path_kwargs = path_call(case, path)
    batch = inputs(case)
    note(f"inputs: {batch}")
    with model_defaults(base, case.defaults):
        kwargs = common_kwargs(case)
        plain = attempt(base, case.seed, **batch, **common_kwargs(case))
        ours = attempt(runner, case.seed, **batch, **{**kwargs, **path_kwargs})
        rules = None if plain.error is not None else plain_rules(case, base, common_kwargs(case), batch["input_ids"])
    if plain.error is not None and numerical(plain.error):
        reject()  # the arguments ban every token somewhere: sampling fails or not depending on the draw
    if plain.error is not None and "impossible prefix" in str(plain.error):
        reject()  # plain decoding itself broke the constraint (nan scores, whose argmax is token 0)
    for error in (plain.error, ours.error):
        if isinstance(error, IndexError) and "tensors used as indices" in str(error):
            reject()  # transformers' WatermarkLogitsProcessor fails on some prefixes (5.24); drafts meet others
    if plain.error is not None:
        event("plain generate() refuses")
        assert ours.error is not None, f"plain generate() raised {plain.error!r}; {path} returned an output"
        return
    refusals = expected_refusals(case, path)
    assert rules is not None
    if padding_only_rows(rules, batch):
        refusals.append("all zeros")  # docs/refusals.md: a row that is all padding
    elif padding_at_end(rules, batch):
        refusals.append("end with padding")  # docs/refusals.md: prompts padded on the right
    if padding_inside(case, rules, batch):
        refusals.append("sliding")  # docs/refusals.md: padding inside a prompt, on a sliding-window model
    if ours.error is not None:
        error = ours.error
        if numerical(error) and not rules.deterministic:
            reject()  # a sampled draw met a position where every token is banned (plain's draw may not)
        if refusals:
            event(f"refused as documented: {refusals}")
            assert isinstance(error, ValueError), f"documented refusal as {type(error).__name__}: {error}"
            assert any(name in str(error) for name in refusals), f"refusal does not name {refusals}: {error}"
            return
        raise AssertionError(f"{path} raised where plain generate() returns: {error!r}") from error
    assert rules is not None
    event("deterministic" if rules.deterministic else "sampled")
    if rules.deterministic:
        compare_deterministic(ours.value, plain.value, rules, case)
        return
    ids = batch["input_ids"]
    ours_seq, plain_seq = _parts(ours.value)[0], _parts(plain.value)[0]
    plain_broken = violations(plain_seq, rules, case, ids)
    note(f"rules plain itself breaks (not checked): {plain_broken}")
    broken = violations(ours_seq, rules, case, ids) - plain_broken
    assert not broken, f"{path} breaks rules plain decoding keeps: {sorted(broken)}\n{ours_seq.tolist()}"
    if isinstance(plain.value, torch.Tensor):
        assert isinstance(ours.value, torch.Tensor), f"plain returns a tensor, ours {type(ours.value).__name__}"
        return
    _, scores, logits = _parts(ours.value)
    _, plain_scores, plain_logits = _parts(plain.value)
    width = ours_seq.shape[1] - rules.prompt_length
    for name, mine, theirs in (("scores", scores, plain_scores), ("logits", logits, plain_logits)):
        assert (mine is None) == (theirs is None), f"{name}: ours and plain disagree on returning it"
        if mine is None:
            continue
        assert len(mine) == width, f"{name}: {len(mine)} positions for {width} new tokens"
        assert all(s.shape == theirs[0].shape for s in mine), f"{name}: shapes differ from plain"
        # Where a row's sampled prefix is plain's too, the scores of the next token are a function of it.
        for r in range(ours_seq.shape[0]):
            for t in range(min(len(mine), len(theirs))):
                p = rules.prompt_length + t
                if not torch.equal(ours_seq[r, :p], plain_seq[r, :p]) or not bool((mine[t][r] != 0).any()):
                    break
                assert torch.allclose(mine[t][r], theirs[t][r], atol=1e-4, rtol=1e-4, equal_nan=True), (
                    f"{name}[{t}] of row {r} differs from plain's after the same prefix"
                )
