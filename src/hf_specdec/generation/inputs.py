"""Checks of the prompts a speculative decoding loop receives, with errors that say what to do instead.

Plain `generate()` lets several malformed prompts through to the model, where they fail deep inside torch
(an out-of-range embedding index, a reshape of an empty tensor, a rotary shape mismatch) or, worse, decode
silently (an attention mask broadcast over the batch, a row with no real token). The speculative loops call
[`check_prompts`] first, so each of these gets one clear error instead.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

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


def _describe(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
