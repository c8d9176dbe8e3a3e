"""`generate(use_mtp=True)` on a model with multi-token-prediction layers: what `SpeculativeGenerationMixin`
runs for it. transformers still prepares everything (generation config, processors, stopping criteria, special
tokens) and then hands the decoding loop to [`mtp_decode`] through its `custom_generate` hook.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.generation.arguments import (
    cache_given,
    check_loop_kwargs,
    passed,
    requested,
    speculative_costs_argument,
    with_stop_strings,
    withhold,
)
from hf_specdec.generation.inputs import check_generate_arguments
from hf_specdec.mtp.decoding import mtp_decode
from hf_specdec.mtp.layers import mtp_layers
from hf_specdec.trees.dynamic import DynamicTree

PATH = "`use_mtp=True`"


def wants_mtp(model: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any]) -> bool:
    """Whether this `generate()` call asks for `use_mtp` (by keyword or generation config)."""
    return bool(requested(model, generation_config, kwargs, "use_mtp"))


def generate_with_mtp(
    model: PreTrainedModel,
    plain_generate: Callable[..., Any],
    inputs: torch.Tensor | None,
    generation_config: GenerationConfig | None,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    tree: DynamicTree | int | None = None,
    assistant: Any = None,
    assistant_vocab: Any = None,
) -> Any:
    """`generate(use_mtp=True)`: the model's own MTP layers draft (chains; with `tree=`, trees from a single
    MTP layer) in the library's loop, at any batch size.

    Args:
        model (`PreTrainedModel`): the target, with `num_mtp_layers` in its config.
        plain_generate (`Callable`): transformers' own `generate()` of the model (the mixin's `super().generate`).
        inputs, generation_config, args, kwargs: the call's arguments, as `generate()` received them.
        tree (`DynamicTree` or `int`, *optional*): grow trees instead of chains.
        assistant, assistant_vocab: the call's (refused: the model drafts for itself).

    Extra settings read from `kwargs` or the generation config: `num_assistant_tokens_schedule`
    (`"adaptive"`, the default: plain steps where drafting does not pay, trees grown as far as they pay;
    `"constant"`: drafting, and the whole tree, at every step) and `speculative_costs`.
    """
    if assistant is not None or assistant_vocab is not None:
        raise ValueError(f"{PATH} drafts with the model's own MTP layers: drop `assistant=` and `assistant_vocab=`.")
    if args:
        raise TypeError(f"Pass generate()'s arguments after `generation_config` by keyword with {PATH}.")
    for name, why in {
        "prompt_lookup_num_tokens": "prompt lookup is its own drafter",
        "num_assistant_tokens": "an MTP chain holds one token per MTP layer",
        "assistant_confidence_threshold": "an MTP chain holds one token per MTP layer",
    }.items():
        if passed(generation_config, kwargs, name):
            raise ValueError(f"`{name}` cannot be combined with {PATH}: {why}.")
    check_loop_kwargs(kwargs, PATH)
    schedule = requested(model, generation_config, kwargs, "num_assistant_tokens_schedule") or "adaptive"
    if schedule not in ("adaptive", "constant"):
        raise ValueError(f"num_assistant_tokens_schedule takes 'adaptive' or 'constant' with {PATH}, got {schedule!r}.")
    check_generate_arguments(model, inputs, kwargs, PATH)
    layers = mtp_layers(model)  # refuses a model without MTP layers before transformers prepares anything
    costs = speculative_costs_argument(kwargs)
    generation_config, kwargs = withhold(model, generation_config, kwargs, ("use_mtp", "num_assistant_tokens_schedule"))
    generation_config, kwargs = with_stop_strings(model, generation_config, kwargs)
    decode = functools.partial(
        mtp_decode,
        mtp=layers,
        tree=tree,
        costs=costs,
        adaptive=schedule == "adaptive",
        streamer=kwargs.get("streamer"),
        continue_cache=cache_given(kwargs),
    )
    return plain_generate(inputs, generation_config, custom_generate=decode, **kwargs)
