"""Checks of the prompts a speculative decoding loop receives, with errors that say what to do instead.

Plain `generate()` lets several malformed prompts through to the model, where they fail deep inside torch
(an out-of-range embedding index, a reshape of an empty tensor, a rotary shape mismatch) or, worse, decode
silently (an attention mask broadcast over the batch, a row with no real token). The speculative loops call
[`check_prompts`] first, so each of these gets one clear error instead.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.cache_utils import Cache

from hf_specdec.generation.kv_cache import AttentionLayout
from hf_specdec.generation.validation import check_architecture, output_vocab_size


def check_prompts(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """Raise when `model` cannot decode `input_ids` speculatively.

    Args:
        model (`PreTrainedModel`): the target (or the base of Medusa heads).
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts, as `generate()` passes
            them to its decoding method.
        attention_mask (`torch.Tensor` of shape `(batch, prompt)`, *optional*): 0 on left padding.

    Raises:
        `ValueError`: for a model speculative decoding cannot run (see [`check_architecture`]), empty prompts,
            ids outside the model's vocabulary, an attention mask of another shape, a row that is all padding,
            right padding, or padding inside a prompt of a sliding-window model.
        `TypeError`: for `input_ids` that are not integers (other integer types are taken as plain `generate()`
            takes them, and decoded as `torch.long`).
    """
    check_architecture(model, "target")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            "`input_ids` must be a 2D tensor of token ids, one row per prompt (batch, prompt length); got "
            f"{_describe(input_ids)}."
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(
            f"`input_ids` must hold integer token ids, got {input_ids.dtype}. Pass the tokenizer's ids "
            "(`tokenizer(..., return_tensors='pt')`), or convert with `input_ids.long()`."
        )
    if input_ids.shape[1] == 0:
        raise ValueError(
            f"`input_ids` has shape {tuple(input_ids.shape)}: the prompts are empty. Speculative decoding continues "
            "a prompt; give every row at least one token (e.g. the tokenizer's BOS token)."
        )
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"`attention_mask` has shape {_describe(attention_mask)} but `input_ids` has shape "
                f"{tuple(input_ids.shape)}: pass one mask value per token (1 on tokens, 0 on left padding), e.g. "
                "the `attention_mask` the tokenizer returns with the ids."
            )
        empty = (~attention_mask.bool().any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"Row(s) {empty} of `attention_mask` are all zeros: those prompts are padding only, with no token to "
                "continue (without an `attention_mask`, transformers takes every `pad_token_id` token for padding). "
                "Drop those rows, or give each at least one token (e.g. the tokenizer's BOS token)."
            )
        right = (~attention_mask[:, -1].bool()).nonzero().flatten().tolist()
        if right:
            raise ValueError(
                f"Row(s) {right} of `attention_mask` end with padding (right padding, or, without an "
                "`attention_mask`, a prompt ending with `pad_token_id`): generation continues after the padding, "
                "where plain `generate()` warns that its output is wrong, and speculative decoding cannot match it. "
                "Pad on the left (the tokenizer's `padding_side='left'`)."
            )
        inside = attention_mask[:, :-1].bool() & ~attention_mask[:, 1:].bool()  # a real token, then padding
        if AttentionLayout(model).sliding_window is not None and bool(inside.any()):
            raise ValueError(
                "`attention_mask` has zeros after a real token (padding inside a prompt, or, without an "
                "`attention_mask`, a `pad_token_id` token inside a prompt), and the model attends through a sliding "
                "window: transformers counts that window over the padding, speculative decoding over real tokens, so "
                "the outputs could differ. Pad on the left only (the tokenizer's `padding_side='left'`)."
            )
    vocab = output_vocab_size(model)
    embeddings = model.get_input_embeddings()
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        vocab = min(vocab, int(weight.shape[0]))
    outside = ((input_ids < 0) | (input_ids >= vocab)).nonzero()
    if outside.numel():
        row, column = (int(i) for i in outside[0])
        padding = attention_mask is not None and not bool(attention_mask[row, column])
        raise ValueError(
            f"`input_ids` holds id {int(input_ids[row, column])} (row {row}, position {column}"
            f"{', under padding' if padding else ''}), outside the {vocab} ids (0 to {vocab - 1}) the model can "
            "embed and score. Encode the prompts with the model's own tokenizer, and pad with its pad_token_id."
        )


def check_generate_arguments(model: PreTrainedModel, inputs: Any, kwargs: dict[str, Any], path: str) -> None:
    """Refuse, before transformers prepares anything, the `generate()` arguments no speculative path can take: a
    target that cannot decode speculatively, prompts that are not a 2D tensor of ids (or embeddings instead of
    ids), a cache passed under both its names, and arguments of the wrong type that transformers would fail on
    deep inside.

    Args:
        model (`PreTrainedModel`): the target (the base of Medusa heads).
        inputs: `generate()`'s first argument, or `None` (then `input_ids=` or `inputs=` in `kwargs`).
        kwargs (`dict`): the other arguments of `generate()`.
        path (`str`): how the messages name the speculative path, e.g. "`assistant=`".
    """
    check_architecture(model, "target")
    if kwargs.get("cache") is not None and kwargs.get("past_key_values") is not None:
        raise ValueError("`cache=` and `past_key_values=` both pass a cache: pass it once (`cache=`).")
    for name in ("cache", "past_key_values"):
        if kwargs.get(name) is not None and not isinstance(kwargs[name], Cache):
            raise ValueError(
                f"`{name}=` takes a transformers Cache (e.g. `DynamicCache()`, or `out.cache` of an earlier call), "
                f"got {type(kwargs[name]).__name__}."
            )
    if kwargs.get("inputs_embeds") is not None:
        raise ValueError(
            f"`inputs_embeds=` cannot be passed with {path}: drafts are token ids, and the target verifies them by "
            "id. Pass `input_ids` (with their `attention_mask`), or call generate() without it to generate from "
            "embeddings."
        )
    if kwargs.get("synced_gpus"):
        raise ValueError(
            f"`synced_gpus=True` cannot be combined with {path}: each process verifies its own drafts, whose "
            "forwards cannot be kept in step across processes. Drop `synced_gpus`."
        )
    input_ids = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs"))
    if input_ids is not None and not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"`input_ids` must be a tensor of token ids of shape (batch, prompt length), got "
            f"{type(input_ids).__name__}: pass `tokenizer(..., return_tensors='pt')`'s ids."
        )
    if input_ids is not None and input_ids.dim() != 2:
        raise ValueError(
            f"`input_ids` must be 2D (batch, prompt length), got shape {tuple(input_ids.shape)}: for one prompt, "
            "pass `input_ids[None]`."
        )
    mask = kwargs.get("attention_mask")
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"`attention_mask` must be a tensor of shape (batch, prompt length) or None, got {type(mask).__name__}."
        )
    check_generation_config_type(kwargs.get("generation_config"))
    streamer = kwargs.get("streamer")
    if streamer is not None and not all(callable(getattr(streamer, m, None)) for m in ("put", "end")):
        raise TypeError(
            "`streamer` must have `put` and `end` methods (e.g. transformers' TextStreamer), got "
            f"{type(streamer).__name__}."
        )


def check_generation_config_type(generation_config: Any) -> None:
    """Refuse a `generation_config` that is not a transformers `GenerationConfig` (nor `None`)."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"`generation_config` must be a transformers GenerationConfig or None, got "
            f"{type(generation_config).__name__}: pass `GenerationConfig(...)`, or the settings as arguments."
        )


def _describe(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
