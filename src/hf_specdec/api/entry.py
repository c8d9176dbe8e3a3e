"""`speculative_generate(model, ...)`: `generate()` with this library's speculative arguments, on any transformers
causal LM, without changing the model.

Without speculative arguments it is the model's own `generate()`, untouched. With a draft model (`assistant=`, or
transformers' name `assistant_model=`), self-speculation from the model's first layers (`assistant_early_exit=`)
or prompt lookup (`prompt_lookup_num_tokens=`), transformers still prepares everything (generation config,
processors, stopping criteria, lengths, special tokens) and then hands the decoding loop to
[`speculative_decode`] through its public `custom_generate` hook.

Transformers' speculative methods that this loop does not run stay transformers' own, untouched, when asked for by
transformers' own arguments: `assistant_model=` with an assistant that attends to the target's cache (Gemma 4
assistants) or with `speculation_type="dflash"`. Combined with this library's own arguments (`assistant=`,
prompt lookup) they are refused. `use_mtp=True` alone (the model's
own MTP layers draft) runs through the loop.

`SpeculativeGenerationMixin.generate` (what [`speculative`] gives a model) and the Hub entry
(`custom_generate/generate.py`) both call this function.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.drafters.decoding import speculative_decode
from hf_specdec.drafters.draft_length import SCHEDULES, DraftLengthPolicy
from hf_specdec.drafters.draft_tree import draft_tree_spec
from hf_specdec.drafters.early_exit import early_exit_draft
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.drafters.text_alignment import Tokenizers
from hf_specdec.drafters.vocab import check_token_ids
from hf_specdec.generation.arguments import (
    LOOKUP_SETTINGS,
    cache_given,
    check_loop_kwargs,
    lookup_settings,
    passed,
    requested,
    speculative_costs_argument,
    with_stop_strings,
    withhold,
)
from hf_specdec.generation.inputs import check_generate_arguments, check_generation_config_type
from hf_specdec.generation.model_class import transformers_generate
from hf_specdec.generation.validation import (
    check_architecture,
    check_models,
    check_other_tokenizer_settings,
    other_tokenizers,
    output_vocab_size,
)
from hf_specdec.mtp.generate import generate_with_mtp, wants_mtp
from hf_specdec.trees.dynamic import DynamicTree

# Defaults measured with the benchmark (docs/benchmarks.md); a user's generation config overrides them.
DEFAULT_NUM_ASSISTANT_TOKENS = 8
DEFAULT_SCHEDULE = "adaptive"
DEFAULT_CONFIDENCE_THRESHOLD: float | None = None

# Draft models that attend to the target's cache (transformers' `SinglePositionMultiTokenCandidateGenerator`).
_CROSS_ATTENTION_ASSISTANTS = ("Gemma4Assistant", "Gemma4UnifiedAssistant")


def speculative_generate(
    model: PreTrainedModel,
    inputs: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    *args: Any,
    assistant: PreTrainedModel | None = None,
    assistant_vocab: torch.Tensor | Sequence[int] | None = None,
    tree: DynamicTree | int | None = None,
    plain_generate: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> Any:
    """`model.generate(inputs, generation_config, **kwargs)` with the speculative arguments below, decoded by this
    library's loop at any batch size; `model` is not changed (its class and generation config stay as they are).

    Args:
        model (`PreTrainedModel`): the target, a transformers causal LM.
        inputs, generation_config, kwargs: as for transformers' `generate()`.
        assistant (`PreTrainedModel`): a smaller causal LM that drafts tokens (transformers' name,
            `assistant_model=`, is taken as the same): with the target's vocabulary, or of another vocabulary with
            `tokenizer=` and `assistant_tokenizer=` (see below).
        assistant_early_exit (`int`): self-speculation: the target's own first `assistant_early_exit` layers, its
            final norm and its lm_head draft (LayerSkip; they share the target's weights, with a KV cache of their
            own). Pays on models trained for early exit (e.g. LayerSkip checkpoints).
        use_mtp (`bool`): the model's own multi-token-prediction layers draft (configs with `num_mtp_layers`:
            DeepSeek-V3, GLM-4.5 MoE, ERNIE 4.5 MoE, Mellum, ...): chains of one token per MTP layer, or with
            `tree=`, trees grown from a single MTP layer.
        assistant_ensemble_weight (`float`): sampling with a draft model only, **lossy** (opt-in): drafted
            tokens are verified against `w * p + (1 - w) * q` (the target's and the draft's distributions) instead
            of `p`, so that more are accepted; drafted tokens then follow that mix, not the target's
            distribution. `1.0` is exact speculative sampling.
        num_assistant_tokens (`int`): tokens drafted per step; the most per step with "adaptive" (default 8).
        num_assistant_tokens_schedule (`str`): `"adaptive"` (default: stop drafting when another draft forward
            is expected to bring less than its cost times the tokens per plain step recent steps brought),
            `"constant"` or `"heuristic"`.
        assistant_confidence_threshold (`float`): stop drafting once the draft's top probability falls below
            this in every row (default: off).
        tree (`DynamicTree` or `int`): with a draft model, the draft grows a tree per row and step instead of a
            chain (EAGLE-2-style: `top_k` children per frontier node, the best `num_nodes` verified in one target
            forward; an int is a number of nodes with the default shape). With prompt lookup too, each row's
            looked-up continuation is grafted onto its tree. `num_assistant_tokens_schedule="constant"` grows and
            verifies the whole tree at every step (default "adaptive": as far as it pays).
        assistant_vocab (`torch.LongTensor` or list of ids): a draft vocabulary, e.g. the most frequent tokens
            (`hf_specdec.drafters.vocab.draft_vocabulary`): the draft proposes only these tokens and skips the
            rest of its lm_head, which makes each draft forward cheaper on large vocabularies. Lossless: the target
            still verifies every token over its full vocabulary (default: the draft's whole vocabulary).
        prompt_lookup_num_tokens (`int`): draft by prompt lookup: each row proposes up to this many tokens that
            followed its last n-gram where it last occurred in the row (prompt or generated text). Alone, no draft
            model runs; with a draft model too, each step drafts with whichever of the two is expected to commit
            more tokens per unit of cost. Lossless, at any batch size. With the "adaptive" schedule (default)
            fewer are proposed when the measured acceptance at later positions does not pay for verifying them;
            `num_assistant_tokens_schedule="constant"` always proposes this many.
        max_matching_ngram_size (`int`): the longest n-gram prompt lookup matches (default 3). With a draft model
            and prompt lookup, `num_assistant_tokens_schedule` applies to the draft model, and the lookup is
            adaptive unless the schedule is `"constant"`.
        generator (`torch.Generator`): randomness for sampling (default: torch's global generator).
        speculative_costs (`SpeculativeCosts`): fixed costs of a draft forward and of verifying one more token,
            instead of timings measured while decoding (e.g. `out.speculative.costs` of an earlier run). Draft
            lengths and the hybrid's choice then depend on the tokens alone, so sampling with a seeded
            `generator` is bitwise reproducible on a fixed machine.
        tokenizer / assistant_tokenizer: the target's and the draft's tokenizers. Where their vocabularies
            differ, the draft reads the text in its own tokens and its drafts are re-encoded as target tokens
            (`hf_specdec.drafters.translated`: greedy stays token-identical to plain greedy; sampling proposes only
            the tokens both vocabularies share and keeps the target's distribution exactly; chains only, without
            prompt lookup or `assistant_vocab`). Where they are the same, they let vocabulary sizes differ.
            `tokenizer` is also needed for `stop_strings`.
        plain_generate (`Callable`, *optional*): the `generate()` to hand the prepared call to (default: the one
            transformers gives `model`'s class).

    Returns:
        What plain `generate()` returns: the sequences, or a `SpeculativeDecoderOnlyOutput` (a transformers
        `GenerateDecoderOnlyOutput` with the call's `speculative` statistics) with `return_dict_in_generate=True`.
    """
    plain = transformers_generate(model) if plain_generate is None else plain_generate
    drafts = {"assistant": assistant, "assistant_vocab": assistant_vocab, "tree": tree}
    if _for_transformers(model, generation_config, kwargs, drafts):
        given = {name: value for name, value in drafts.items() if value is not None}
        return plain(inputs, generation_config, *args, **given, **kwargs)
    assistant, generation_config, kwargs = _draft_model_argument(model, assistant, generation_config, kwargs)
    drafts["assistant"] = assistant
    if _plain_refuses_the_config(generation_config, kwargs, drafts):
        return plain(inputs, generation_config, *args, **kwargs)
    if wants_mtp(model, generation_config, kwargs):
        return generate_with_mtp(model, plain, inputs, generation_config, args, kwargs, **drafts)
    if not _drafting_asked(model, generation_config, kwargs, drafts):
        return plain(inputs, generation_config, *args, **kwargs)
    path = "`assistant=`" if assistant is not None else "prompt lookup"
    if args:
        raise TypeError(f"Pass generate()'s arguments after `generation_config` by keyword with {path}.")
    check_generate_arguments(model, inputs, kwargs, path)
    check_loop_kwargs(kwargs, path)
    assistant, assistant_vocab, tokenizers = _draft_model(model, generation_config, kwargs, drafts)
    loop = _loop_settings(model, generation_config, kwargs, assistant, tree)
    generation_config, kwargs = withhold(model, generation_config, kwargs, (*LOOKUP_SETTINGS, ENSEMBLE))
    generation_config, kwargs = with_stop_strings(model, generation_config, kwargs)
    decode = functools.partial(
        speculative_decode,
        assistant=assistant,
        assistant_vocab=assistant_vocab,
        tree=None if tree is None else draft_tree_spec(tree),
        tokenizers=tokenizers,
        streamer=kwargs.get("streamer"),
        continue_cache=cache_given(kwargs),
        **loop,
    )
    return plain(inputs, generation_config, custom_generate=decode, **kwargs)


def _for_transformers(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any], drafts: dict[str, Any]
) -> bool:
    """Whether the call goes to transformers' `generate()` as it is: a generation recipe on the Hub (or in a local
    folder; transformers loads it and hands it every argument, the speculative ones included), a decoding loop of
    the caller's own with no draft asked for, or one of transformers' methods this loop does not run."""
    custom = kwargs.get("custom_generate")
    drafting = any(value is not None for value in drafts.values()) or kwargs.get("assistant_model") is not None
    return (
        isinstance(custom, str)
        or (custom is not None and not drafting and not kwargs.get("prompt_lookup_num_tokens"))
        or _transformers_only(model, kwargs.get("assistant_model"), generation_config, kwargs)
    )


def _plain_refuses_the_config(
    generation_config: GenerationConfig | None, kwargs: dict[str, Any], drafts: dict[str, Any]
) -> bool:
    """Whether `generation_config` is not a `GenerationConfig` in a call that asks for no drafting: plain
    `generate()` then gives its own error. With drafting, such a config is refused here."""
    if generation_config is None or isinstance(generation_config, GenerationConfig):
        return False
    if not any(value is not None for value in drafts.values()) and not kwargs.get("prompt_lookup_num_tokens"):
        return True
    check_generation_config_type(generation_config)
    return False


def _drafting_asked(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any], drafts: dict[str, Any]
) -> bool:
    """Whether the call drafts with a draft model or prompt lookup; the draft model's own settings without one
    are refused."""
    if drafts["assistant"] is None and drafts["assistant_vocab"] is not None:
        raise ValueError("`assistant_vocab` restricts the draft of `assistant=`: pass a draft model too.")
    if drafts["assistant"] is None and drafts["tree"] is not None:
        raise ValueError(
            "`tree=` is the tree a draft model grows: pass `assistant=` too (Medusa heads take "
            "`tree=` in MedusaForCausalLM.generate(medusa=True))."
        )
    lookup_tokens = requested(model, generation_config, kwargs, "prompt_lookup_num_tokens")
    return drafts["assistant"] is not None or lookup_tokens is not None


def _draft_model(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any], drafts: dict[str, Any]
) -> tuple[PreTrainedModel | None, torch.Tensor | None, Tokenizers | None]:
    """The draft model checked against the target, its draft vocabulary checked, and the two tokenizers where the
    draft drafts through text (`assistant_tokenizer` is taken out of `kwargs`)."""
    assistant, assistant_vocab, tokenizers = drafts["assistant"], drafts["assistant_vocab"], None
    if assistant is None:
        return None, None, None
    assistant = as_draft_model(assistant)
    tokenizer, assistant_tokenizer = kwargs.get("tokenizer"), kwargs.pop("assistant_tokenizer", None)
    check_models(model, assistant, tokenizer, assistant_tokenizer)
    if other_tokenizers(tokenizer, assistant_tokenizer):  # the draft drafts through text
        lookup_tokens = requested(model, generation_config, kwargs, "prompt_lookup_num_tokens")
        check_other_tokenizer_settings(drafts["tree"], assistant_vocab, lookup_tokens)
        tokenizers = Tokenizers(tokenizer, assistant_tokenizer)
    if assistant_vocab is not None:
        vocab_size = min(output_vocab_size(model), output_vocab_size(assistant))
        assistant_vocab = check_token_ids(torch.as_tensor(assistant_vocab), vocab_size, "`assistant_vocab`")
    return assistant, assistant_vocab, tokenizers


def _loop_settings(
    model: PreTrainedModel,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    assistant: PreTrainedModel | None,
    tree: DynamicTree | int | None,
) -> dict[str, Any]:
    """`speculative_decode`'s settings from the call's arguments, checked: the draft length schedule, prompt
    lookup, fixed costs and the (lossy, opt-in) ensemble weight."""
    lookup = lookup_settings(model, generation_config, kwargs)
    schedule = _pick(requested(model, generation_config, kwargs, "num_assistant_tokens_schedule"), DEFAULT_SCHEDULE)
    if schedule not in SCHEDULES:
        raise ValueError(f"num_assistant_tokens_schedule must be one of {SCHEDULES}, got {schedule!r}.")
    policy = _draft_length_policy(model, generation_config, kwargs, assistant, schedule)
    for name in ("num_assistant_tokens", "assistant_confidence_threshold"):
        if tree is not None and passed(generation_config, kwargs, name):
            raise ValueError(f"`{name}` sets a draft chain's length; with `tree=` the DynamicTree sets the shape.")
    if tree is not None and schedule == "heuristic":
        raise ValueError(
            "num_assistant_tokens_schedule='heuristic' grows and shrinks a draft chain; with `tree=` take "
            "'adaptive' (default: the tree grows and is verified as far as it pays) or 'constant' (the whole "
            "tree at every step)."
        )
    prompt_lookup = None
    if lookup is not None:
        prompt_lookup = PromptLookupDrafter(lookup.num_tokens, lookup.max_ngram_size, adaptive=schedule != "constant")
    return {
        "prompt_lookup": prompt_lookup,
        "draft_length": policy,
        "costs": speculative_costs_argument(kwargs),
        "ensemble_weight": _ensemble_weight(model, generation_config, kwargs, assistant, lookup is not None),
    }


ENSEMBLE = "assistant_ensemble_weight"


def _ensemble_weight(
    model: PreTrainedModel,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    assistant: PreTrainedModel | None,
    lookup: bool,
) -> float | None:
    """`assistant_ensemble_weight` (opt-in, lossy: see `AcceptanceRule`), checked: a weight in (0, 1] on the
    target's distribution, for a draft model's drafts alone."""
    weight = requested(model, generation_config, kwargs, ENSEMBLE)
    if weight is None:
        return None
    if assistant is None or lookup:
        raise ValueError(
            f"`{ENSEMBLE}` mixes a draft model's distribution into the target's: it needs `assistant=` and "
            "cannot be combined with prompt lookup, whose drafts have no distribution. Drop it."
        )
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 < weight <= 1.0:
        raise ValueError(f"`{ENSEMBLE}` is the target's weight in the mix, in (0, 1]; got {weight!r}.")
    return float(weight)


def _draft_model_argument(
    model: PreTrainedModel,
    assistant: PreTrainedModel | None,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
) -> tuple[PreTrainedModel | None, GenerationConfig | None, dict[str, Any]]:
    """The draft model the call asks for: `assistant=`, transformers' `assistant_model=` (the same thing), or the
    target's own first layers (`assistant_early_exit=`); and the generation config and keyword arguments to hand
    on, without them (transformers would act on `assistant_early_exit` itself)."""
    kwargs = dict(kwargs)
    assistant_model = kwargs.pop("assistant_model", None)
    if assistant_model is not None:
        if assistant is not None:
            raise ValueError("`assistant=` and `assistant_model=` both name a draft model: pass it once (either name).")
        assistant = assistant_model
    if assistant is not None and type(assistant).__name__.startswith(_CROSS_ATTENTION_ASSISTANTS):
        raise ValueError(
            f"{type(assistant).__name__} drafts from the target's own KV cache (cross-attention), which this "
            "library's loop does not run: pass it as `assistant_model=` for transformers' own assisted decoding."
        )
    early_exit = requested(model, generation_config, kwargs, "assistant_early_exit")
    if early_exit is None:
        return assistant, generation_config, kwargs
    if assistant is not None:
        raise ValueError(
            "`assistant_early_exit` drafts with the target's own first layers; it cannot be combined with a draft "
            "model. Pass one of the two."
        )
    check_architecture(model, "target")  # before cutting it: a model speculative decoding cannot run is refused
    generation_config, kwargs = withhold(model, generation_config, kwargs, ("assistant_early_exit",))
    return early_exit_draft(model, early_exit), generation_config, kwargs


def _transformers_only(
    model: PreTrainedModel,
    assistant_model: Any,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
) -> bool:
    """Whether a call with transformers' `assistant_model=` asks for something only transformers' own assisted
    decoding does: an assistant that attends to the target's cache, or DFlash. Such calls are handed to
    transformers as they are."""
    if assistant_model is None:
        return False
    if type(assistant_model).__name__.startswith(_CROSS_ATTENTION_ASSISTANTS):
        return True
    return requested(model, generation_config, kwargs, "speculation_type") not in (None, "assisted")


def _draft_length_policy(
    model: PreTrainedModel,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    assistant: PreTrainedModel | None,
    schedule: str,
) -> DraftLengthPolicy | None:
    """The draft model's length schedule from `num_assistant_tokens*` and `assistant_confidence_threshold`
    (our measured defaults where unset); `None` without a draft model, whose settings are then refused."""
    if assistant is None:
        for name in ("num_assistant_tokens", "assistant_confidence_threshold"):
            if passed(generation_config, kwargs, name):
                raise ValueError(
                    f"`{name}` tunes the draft model of `assistant=`; prompt lookup drafts up to "
                    "`prompt_lookup_num_tokens` tokens per step. Drop it."
                )
        if schedule == "heuristic":
            raise ValueError(
                "num_assistant_tokens_schedule='heuristic' follows a draft model's acceptance; prompt lookup "
                "takes 'adaptive' (default) or 'constant'."
            )
        return None

    def setting(name: str) -> Any:
        return requested(model, generation_config, kwargs, name)

    return DraftLengthPolicy(
        num_tokens=_pick(setting("num_assistant_tokens"), DEFAULT_NUM_ASSISTANT_TOKENS),
        schedule=schedule,
        confidence_threshold=_pick(setting("assistant_confidence_threshold"), DEFAULT_CONFIDENCE_THRESHOLD),
    )


def _pick(value: Any, default: Any) -> Any:
    """A speculative setting from the user's generation config or `generate()` kwargs, else our default."""
    return default if value is None else value


def as_draft_model(assistant: Any) -> PreTrainedModel:
    """The causal LM to draft with, from what `assistant=` received: a transformers causal LM with its
    language-model head, or a PEFT model around one whose adapters live in its layers (LoRA and the like:
    the wrapped model, adapters active, drafts)."""
    try:
        from peft import PeftModel
    except ImportError:  # peft is optional: without it no PEFT model can be passed
        PeftModel = None
    if PeftModel is not None and isinstance(assistant, PeftModel):
        if assistant.active_peft_config.is_prompt_learning:
            raise ValueError(
                "`assistant=` is a PEFT model with a prompt-learning adapter (prefix or prompt tuning), which adds "
                "virtual tokens to every forward and cannot be rolled back with the draft's cache. Merge or drop "
                "the adapter, or pass a draft without it."
            )
        assistant = assistant.get_base_model()
    if not isinstance(assistant, PreTrainedModel):
        raise TypeError(
            f"`assistant=` takes a transformers causal LM (e.g. `AutoModelForCausalLM.from_pretrained(...)`), got "
            f"{type(assistant).__name__}."
        )
    if assistant.get_output_embeddings() is None:
        raise TypeError(
            f"`assistant=` got {type(assistant).__name__}, which has no language-model head to score tokens with. "
            "Load the draft with `AutoModelForCausalLM.from_pretrained(...)` instead of `AutoModel`."
        )
    return assistant
