"""Checks that a target and a draft can decode together, with errors that say what to do instead."""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode

from hf_specdec.generation.kv_cache import STATIC_CACHE_IMPLEMENTATIONS, AttentionLayout
from hf_specdec.generation.recurrent import check_recorded, has_recurrent_layers

# Models whose layers carry a recurrent state but whose configs have no `layer_types` to say so.
# (Mamba, Mamba2 and the hybrids declare theirs, which their caches keep and `generation.recurrent` rolls back.)
_RECURRENT_MODEL_TYPES = {"rwkv", "xlstm"}


def output_vocab_size(model: PreTrainedModel) -> int:
    """Number of logits the model produces per position: the output projection's width (`out_features`, which
    quantised linear layers keep too, where `weight` becomes a method), else its weight's rows, else the config's
    vocabulary."""
    embeddings = model.get_output_embeddings()
    size = getattr(embeddings, "out_features", None)
    if isinstance(size, int):
        return size
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(model.config.get_text_config(decoder=True).vocab_size)


def eos_token_ids(model: PreTrainedModel) -> list[int]:
    """The model's end-of-sequence ids from its generation config, as a list (empty when it has none)."""
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def check_architecture(model: PreTrainedModel, role: str = "target") -> None:
    """Raise `ValueError` when `model` cannot take part in speculative decoding at all: an encoder-decoder, a
    model whose layers keep a recurrent state, or one without the positions and 4D masks verification needs
    (see `AttentionLayout`). `role` ("target" or "draft") names it in the messages."""
    check_rollback(model, role)
    if has_recurrent_layers(model):
        check_recorded(model)
    AttentionLayout(model)  # layer types, position ids, attention implementation


def check_rollback(model: PreTrainedModel, role: str = "target") -> None:
    """Raise `ValueError` for a model whose state cannot be rolled back to an earlier token: an encoder-decoder
    or a model whose layers keep a recurrent state."""
    if model.config.is_encoder_decoder:
        raise ValueError(
            f"The {role} ({type(model).__name__}) is an encoder-decoder model; speculative decoding here "
            "supports decoder-only causal LMs. Use transformers' `assistant_model=` for encoder-decoders."
        )
    parameters = inspect.signature(model.forward).parameters
    own_state = "state" in parameters or ("cache_params" in parameters and "cache" not in parameters)
    if model.config.model_type in _RECURRENT_MODEL_TYPES or own_state:
        raise ValueError(
            f"The {role} ({type(model).__name__}) keeps a recurrent state outside transformers' cache, which cannot be "
            "rolled back to an earlier token when drafts are rejected. Speculative decoding supports attention "
            "layers and the recurrent layers transformers' caches hold (linear attention, Mamba, short "
            "convolutions); decode this model with plain `generate()`."
        )
    if not _takes_a_cache(type(model)):
        raise ValueError(
            f"The {role} ({type(model).__name__}) keeps no KV cache (its forward takes none, and plain `generate()` "
            "recomputes the whole text at every step), while speculative decoding verifies drafts against a cache. "
            "Decode this model with plain `generate()`."
        )


def check_models(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: Any = None,
    assistant_tokenizer: Any = None,
) -> None:
    """Raise `ValueError` when `draft` cannot draft for `target`.

    The two must be decoder-only causal LMs (see [`check_architecture`]) whose token ids mean the same thing,
    or whose tokenizers are both given (then any two vocabularies: see [`other_tokenizers`]); the draft must be
    another model than the target (a copy with equal weights is fine), with its weights loaded. Its device and
    dtype may differ from the target's (drafts move between devices; the target verifies every token in its own
    dtype). Vocabulary sizes may differ (models often pad their embedding matrix), provided both tokenizers are
    given.
    """
    for role, model in (("target", target), ("draft", draft)):
        check_architecture(model, role)
    if draft is target:
        raise ValueError(
            "`assistant=` is the target itself: every drafted token is then accepted, but each costs a full "
            "forward of the target, so this is always slower than plain decoding. Pass a smaller draft model of "
            "the same tokenizer, or use `prompt_lookup_num_tokens=` (no draft model), or drop `assistant=`."
        )
    if draft.device.type == "meta":
        raise ValueError(
            "The draft's weights are on the 'meta' device: they hold no values (a model built under "
            "`init_empty_weights` or not loaded yet). Load the draft's weights, e.g. `from_pretrained(...)`."
        )
    if assistant_tokenizer is not None:
        if tokenizer is None:
            raise ValueError("`assistant_tokenizer=` needs `tokenizer=` too: the two vocabularies are compared.")
        if other_tokenizers(tokenizer, assistant_tokenizer):
            return  # the draft drafts through text: its ids never reach the target
        size = len(tokenizer)
        if size > min(output_vocab_size(target), output_vocab_size(draft)):
            raise ValueError(
                f"The tokenizer has {size} tokens, more than the target ({output_vocab_size(target)}) or the draft "
                f"({output_vocab_size(draft)}) can score: pass the tokenizer the models were trained with."
            )
        return
    target_size, draft_size = output_vocab_size(target), output_vocab_size(draft)
    if target_size != draft_size:
        raise ValueError(
            f"The target scores {target_size} tokens and the draft {draft_size}: pass each model's tokenizer to "
            "`generate()` (`tokenizer=` and `assistant_tokenizer=`). Sharing a tokenizer (embeddings padded to "
            "different sizes), the draft's ids are then checked and used as they are; with another tokenizer, its "
            "drafts reach the target as text."
        )
    # EOS ids legitimately differ between a base and an instruct model of one tokenizer (the target's
    # decide when to stop); a different BOS id means a different tokenizer.
    mine, theirs = getattr(target.config, "bos_token_id", None), getattr(draft.config, "bos_token_id", None)
    if isinstance(mine, int) and isinstance(theirs, int) and mine != theirs:
        raise ValueError(
            f"The target's bos_token_id is {mine} but the draft's is {theirs}: they likely use different "
            "tokenizers. If the vocabularies really are the same, pass `tokenizer=` and "
            "`assistant_tokenizer=` to `generate()` to have them compared."
        )


def other_tokenizers(tokenizer: Any, assistant_tokenizer: Any) -> bool:
    """Whether both tokenizers are given and their vocabularies differ: the draft then reads and proposes text,
    re-encoded between the two tokenizers (`hf_specdec.drafters.translated`). Remembered for the pair while their
    sizes stay the same (building a vocabulary of 150k tokens takes a noticeable part of a second)."""
    if tokenizer is None or assistant_tokenizer is None:
        return False
    if tokenizer is assistant_tokenizer:
        return False
    sizes = (len(tokenizer), len(assistant_tokenizer))
    try:
        compared = _COMPARED.setdefault(tokenizer, weakref.WeakKeyDictionary())
    except TypeError:  # a tokenizer that cannot be weakly referenced: compared every time
        return tokenizer.get_vocab() != assistant_tokenizer.get_vocab()
    known = compared.get(assistant_tokenizer)
    if known is None or known[0] != sizes:
        known = compared[assistant_tokenizer] = (sizes, tokenizer.get_vocab() != assistant_tokenizer.get_vocab())
    return known[1]


# Whether two tokenizers' vocabularies differ, with their sizes when compared, kept as long as both live.
_COMPARED: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], bool]]] = (
    weakref.WeakKeyDictionary()
)


def check_other_tokenizer_settings(tree: Any, assistant_vocab: Any, prompt_lookup: Any) -> None:
    """Raise `ValueError` for settings a draft of another tokenizer cannot take: its drafts reach the target as
    text re-encoded into one chain of target tokens per row."""
    other = "a draft of another tokenizer (`assistant_tokenizer=` differs from `tokenizer=`)"
    if tree is not None:
        raise ValueError(
            f"`tree=` cannot be combined with {other}: its drafts reach the target as text re-encoded into one "
            "chain of target tokens per row, and each branch of a tree would need its own re-encoding. Drop "
            "`tree=` (the draft then drafts chains), or pass a draft that uses the target's tokenizer."
        )
    if assistant_vocab is not None:
        raise ValueError(
            f"`assistant_vocab` lists target ids for the draft to propose, and {other} scores ids of its own "
            "vocabulary: drop `assistant_vocab`, or pass a draft that uses the target's tokenizer."
        )
    if prompt_lookup is not None:
        raise ValueError(
            f"Prompt lookup cannot be combined with {other}: drafting with both weighs prompt lookup against a "
            "draft of the target's tokenizer only. Drop `prompt_lookup_num_tokens`, or drop `assistant=` to draft "
            "by prompt lookup alone."
        )


# Generation settings the speculative loop does not apply, each with why: other decoding strategies, which
# speculative decoding replaces, and settings of transformers' own loops. Refused when set to anything but
# `generate()`'s default, so that none is silently ignored.
_ANOTHER_STRATEGY = "belongs to another decoding strategy"
_NOT_APPLIED = {
    "penalty_alpha": _ANOTHER_STRATEGY,
    "dola_layers": _ANOTHER_STRATEGY,
    "prompt_lookup_num_tokens": _ANOTHER_STRATEGY,
    "assistant_early_exit": _ANOTHER_STRATEGY,
    "assistant_lookbehind": "tunes transformers' re-tokenising assistant (different tokenizers)",
    "target_lookbehind": "tunes transformers' re-tokenising assistant (different tokenizers)",
    "assistant_ensemble_weight": (
        "verifies against a mix of the target's and a draft model's distributions (lossy), which applies to a "
        "draft model's drafts only (`assistant=`, sampling)"
    ),
    "speculation_type": _ANOTHER_STRATEGY,
    "use_mtp": _ANOTHER_STRATEGY,
    "force_words_ids": _ANOTHER_STRATEGY,
    "constraints": _ANOTHER_STRATEGY,
    "token_healing": _ANOTHER_STRATEGY,
    "low_memory": "sets transformers' beam search memory use",
    "prefill_chunk_size": "sets the chunks of transformers' own prefill; speculative decoding prefills at once",
    "continuous_batching_config": "configures transformers' continuous batching",
}


def check_generation_config(
    config: GenerationConfig, per_token_scores: bool = False, path: str = "`assistant=`"
) -> None:
    """Raise `ValueError` for generation settings speculative decoding does not support.

    `per_token_scores`: whether the decoding path can return `output_scores` / `output_logits`.
    `path`: how the messages name the speculative path the user chose.
    """
    defaults = config._get_default_generation_params()  # what `generate()` fills in when nothing is set
    for name, why in _NOT_APPLIED.items():
        value = getattr(config, name, None)
        if value not in (None, False, 0) and value != defaults.get(name):
            raise ValueError(
                f"`{name}={value!r}` {why} and cannot be combined with {path}; drop it, or drop {path} to use "
                "transformers' own decoding."
            )
    if config.use_cache is False:
        raise ValueError(
            "`use_cache=False` (passed to `generate()`, or saved in the model's `generation_config.json`) cannot "
            "apply: speculative decoding rolls its caches back and forth. Pass `use_cache=True`, or set "
            "`model.generation_config.use_cache = True` for a saved one (plain decoding gives the same tokens "
            "either way)."
        )
    if config.cache_implementation not in (None, "dynamic", *STATIC_CACHE_IMPLEMENTATIONS):
        raise ValueError(
            f"cache_implementation={config.cache_implementation!r} is not supported with {path}: speculative "
            "decoding builds its own caches in device memory, which it rolls back to the accepted tokens at "
            "every step. Use cache_implementation='static' (preallocated, compileable) or 'dynamic'."
        )
    if (config.num_beams or 1) > 1:
        raise ValueError(
            f"Beam search (num_beams={config.num_beams}) cannot be combined with {path}: speculative "
            f"decoding verifies one continuation per row. Use num_beams=1 or drop {path}."
        )
    if config.num_beam_groups is not None and config.num_beam_groups > 1:
        raise ValueError(f"Diverse beam search cannot be combined with {path}: drop num_beam_groups or {path}.")
    if config.guidance_scale is not None and config.guidance_scale != 1:
        raise ValueError(
            f"Classifier-free guidance (guidance_scale) cannot be combined with {path}: drop guidance_scale, or "
            f"drop {path} to use transformers' own decoding."
        )
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.BEAM_SEARCH):
        raise ValueError(f"Generation mode {mode.value!r} cannot be combined with {path}.")
    unsupported = [
        name
        for name in ("output_attentions", "output_hidden_states", "output_scores", "output_logits")
        if getattr(config, name, False) and not (per_token_scores and name in ("output_scores", "output_logits"))
    ]
    if unsupported:
        raise ValueError(
            f"{unsupported} are not available with {path} yet: the verification forward scores "
            "several tokens at once. Use `return_dict_in_generate=True` for the sequences and speculative "
            "statistics, or plain `generate()` for per-step outputs."
        )


@functools.lru_cache(maxsize=64)
def _takes_a_cache(model_class: type) -> bool:
    """Whether the forward of the transformers class `model_class` is built on names a cache among its parameters
    (a subclass's own forward, or a wrapper's, passes it on). Read once per class."""
    for cls in model_class.__mro__:
        if cls.__module__.startswith("transformers.") and "forward" in cls.__dict__:
            return bool({"cache", "past_key_values"} & set(inspect.signature(cls.__dict__["forward"]).parameters))
    return True
