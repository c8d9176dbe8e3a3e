"""`generate()`'s arguments on the speculative paths: read as plain `generate()` reads them, handed on to
transformers without the settings the speculative loop handles itself.

Both speculative entry points (`generate(assistant=... | prompt_lookup_num_tokens=...)` and
`MedusaForCausalLM.generate(medusa=True)`) let transformers' own `generate()` prepare everything (the generation
config, logits processors, stopping criteria, lengths, special tokens) and take over its decoding loop through
the `custom_generate` hook. So the caller's `generation_config` and keyword arguments travel to transformers
untouched, and transformers resolves them exactly as in plain decoding: keyword arguments last, an explicit
`None` included (`eos_token_id=None` means no EOS, even when the model's generation config has one).

Two kinds of settings are taken out first, because transformers would act on them itself:
- prompt lookup's (`prompt_lookup_num_tokens`, `max_matching_ngram_size`): transformers would switch to its
  own assisted decoding (and refuse `num_return_sequences > 1` there);
- `stop_strings`: transformers builds their stopping criterion from `tokenizer=`, which it does not keep
  when a `custom_generate` callable decodes; the criterion is built here instead.

The speculative settings are read with `generate()`'s priority (keyword argument, else the caller's
`generation_config`, else the model's), but without transformers' global defaults: those belong to its own
assisted decoding (`num_assistant_tokens=20`, a constant schedule), and ours are measured ones.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from transformers import GenerationConfig, PreTrainedModel, StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from hf_specdec.generation.decisions import SpeculativeCosts

# `max_matching_ngram_size` by default. Transformers' is 2; 3-token matches are right far more often
# (`hf_specdec.drafters.lookup`), and a row falls back to shorter matches when there is none.
DEFAULT_MAX_MATCHING_NGRAM_SIZE = 3

# Settings transformers would act on itself if they reached its `generate()`.
LOOKUP_SETTINGS = ("prompt_lookup_num_tokens", "max_matching_ngram_size")


def requested(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any], name: str
) -> Any:
    """A generation setting as `generate()` resolves it, before its global defaults: the keyword argument
    (an explicit `None` too), else the caller's `generation_config`, else the model's generation config."""
    if name in kwargs:
        return kwargs[name]
    if generation_config is not None and getattr(generation_config, name, None) is not None:
        return getattr(generation_config, name)
    return getattr(model.generation_config, name, None)


def passed(generation_config: GenerationConfig | None, kwargs: dict[str, Any], name: str) -> bool:
    """Whether the caller set `name` (by keyword, or in the `generation_config` passed to `generate()`), as
    opposed to the model's generation config holding it."""
    return kwargs.get(name) is not None or (
        generation_config is not None and getattr(generation_config, name, None) is not None
    )


def withhold(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any], names: tuple[str, ...]
) -> tuple[GenerationConfig | None, dict[str, Any]]:
    """The `generation_config` and keyword arguments to hand to transformers' `generate()` so that it sees
    the settings `names` unset, and every other argument as the caller passed it (the caller's objects are
    not modified)."""
    kwargs = dict(kwargs)
    copied = False
    for name in names:
        kwargs.pop(name, None)
        if generation_config is not None and getattr(generation_config, name, None) is not None:
            if not copied:
                generation_config, copied = copy.deepcopy(generation_config), True
            setattr(generation_config, name, None)
        if getattr(model.generation_config, name, None) is not None:
            kwargs[name] = None  # the model's default would fill the gap; keyword arguments are applied last
    return generation_config, kwargs


@dataclass(frozen=True)
class LookupSettings:
    """Prompt lookup as `generate()` asked for it."""

    num_tokens: int
    max_ngram_size: int


def lookup_settings(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any]
) -> LookupSettings | None:
    """Prompt lookup's settings (`None` when `prompt_lookup_num_tokens` is unset), checked."""
    num_tokens = requested(model, generation_config, kwargs, "prompt_lookup_num_tokens")
    ngram_size = requested(model, generation_config, kwargs, "max_matching_ngram_size")
    if num_tokens is None:
        if passed(generation_config, kwargs, "max_matching_ngram_size"):
            raise ValueError(
                "`max_matching_ngram_size` sets how prompt lookup matches; pass `prompt_lookup_num_tokens` too."
            )
        return None
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
        raise ValueError(f"prompt_lookup_num_tokens must be a positive integer, got {num_tokens!r}.")
    ngram_size = DEFAULT_MAX_MATCHING_NGRAM_SIZE if ngram_size is None else ngram_size
    if not isinstance(ngram_size, int) or isinstance(ngram_size, bool) or ngram_size < 1:
        raise ValueError(f"max_matching_ngram_size must be a positive integer, got {ngram_size!r}.")
    return LookupSettings(num_tokens, ngram_size)


def with_stop_strings(
    model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any]
) -> tuple[GenerationConfig | None, dict[str, Any]]:
    """Move `stop_strings` (if any) from the generation settings to a `StopStringCriteria` in the
    `stopping_criteria` keyword argument, built with `tokenizer=` (which transformers then drops: it does not
    hand it to a `custom_generate` callable)."""
    stop_strings = requested(model, generation_config, kwargs, "stop_strings")
    tokenizer = kwargs.get("tokenizer")
    if not stop_strings:
        return generation_config, kwargs
    if tokenizer is None:
        raise ValueError(
            "`stop_strings` needs the tokenizer to find the strings in token ids: pass `tokenizer=` to `generate()`."
        )
    generation_config, kwargs = withhold(model, generation_config, kwargs, ("stop_strings",))
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    kwargs["stopping_criteria"] = criteria
    return generation_config, kwargs


def cache_given(kwargs: dict[str, Any]) -> bool:
    """Whether the call continues from a cache of the caller's (`cache=`, or its former name `past_key_values=`)."""
    return any(kwargs.get(name) is not None for name in ("cache", "past_key_values"))


def speculative_costs_argument(kwargs: dict[str, Any]) -> SpeculativeCosts | None:
    """`speculative_costs=`, taken out of `kwargs` (transformers does not know it), checked."""
    costs = kwargs.pop("speculative_costs", None)
    if costs is not None and not isinstance(costs, SpeculativeCosts):
        raise TypeError(f"speculative_costs takes a hf_specdec.SpeculativeCosts, got {type(costs).__name__}.")
    return costs


def check_loop_kwargs(kwargs: dict[str, Any], path: str) -> None:
    """Refuse the `generate()` arguments that take over what the speculative loop of `path` does."""
    clashes = {
        "custom_generate": f"`custom_generate` replaces the decoding loop that {path} provides",
        "negative_prompt_ids": "classifier-free guidance is not supported with speculative decoding",
    }
    for name, why in clashes.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"`{name}` cannot be combined with {path}: {why}.")
