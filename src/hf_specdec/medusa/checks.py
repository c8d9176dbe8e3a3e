"""Checks of what users hand `MedusaForCausalLM`: each refuses a wrong argument with a `TypeError` or `ValueError`
that names it, says what it got and what it takes, before transformers or torch fail on it deeper inside."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from numbers import Real
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from hf_specdec.medusa.labels import IGNORE_INDEX
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.static import PRESET_SIZES, DraftTree


def check_base(base: Any, name: str) -> None:
    """Refuse a base that is not a loaded transformers model (e.g. its name, which `from_pretrained` reads from the
    heads' config instead)."""
    if not isinstance(base, PreTrainedModel):
        raise TypeError(
            f"`{name}` must be a loaded causal LM (a transformers PreTrainedModel, e.g. from "
            f"AutoModelForCausalLM.from_pretrained), got {type(base).__name__}."
            + (" To load the base by name, leave it out: the heads' config names it." if name == "base_model" else "")
        )


def check_token_ids_type(token_ids: Any) -> None:
    """A draft vocabulary is given as a tensor or a list of token ids (its content is checked with the heads)."""
    listed = isinstance(token_ids, list | tuple)
    ints = listed and all(isinstance(i, int) and not isinstance(i, bool) for i in token_ids)
    if token_ids is not None and not (isinstance(token_ids, torch.Tensor) or ints):
        raise TypeError(
            f"`token_ids` must be the draft vocabulary's token ids (a 1D tensor or a list of ints) or None, got "
            f"{type(token_ids).__name__}."
        )


def writable_folder(save_directory: Any, state_dict: Any = None) -> Path:
    """The folder `save_pretrained` writes into, created if needed (after checking its `state_dict` argument)."""
    if state_dict is not None and not isinstance(state_dict, dict):
        raise TypeError(
            f"`state_dict` must be a dict of names to tensors (the whole model's, gathered) or None, got "
            f"{type(state_dict).__name__}."
        )
    if not isinstance(save_directory, str | os.PathLike):
        raise TypeError(
            f"`save_directory` must be a folder (str or Path), got {save_directory!r} "
            f"({type(save_directory).__name__})."
        )
    directory = Path(save_directory).expanduser()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"`save_directory` {save_directory} is a file: pass a folder (it is created if needed).")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def floating_dtype(value: Any, name: str) -> torch.dtype | None:
    """A floating dtype given as a `torch.dtype` or its name (`"bfloat16"`), or `None`."""
    if value is None:
        return None
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"`{name}` must be a floating torch dtype (e.g. torch.float32 or 'bfloat16') or None, got {value!r}."
        )
    return dtype


def check_typical_settings(typical_epsilon: Any, typical_delta: Any) -> None:
    """The typical acceptance's threshold (a probability) and entropy factor (non-negative)."""
    _check_number("typical_epsilon", typical_epsilon, "a number in [0, 1]", lambda x: 0.0 <= x <= 1.0)
    _check_number("typical_delta", typical_delta, "a number >= 0", lambda x: x >= 0.0)


def check_tree_type(tree: Any) -> None:
    """Refuse a `tree=` of a type no tree is given as (its content is checked where it is resolved)."""
    number = isinstance(tree, int) and not isinstance(tree, bool)
    if tree is None or number or isinstance(tree, DraftTree | DynamicTree | str | list | tuple):
        return
    raise TypeError(
        f"`tree` must be a DraftTree, a DynamicTree, a preset name ({', '.join(['chain', *PRESET_SIZES, 'dynamic'])}), "
        f"a number of candidate nodes, or Medusa choices such as [[0], [1], [0, 0]]; got {tree!r} "
        f"({type(tree).__name__})."
    )


def check_forward_inputs(
    sizes: tuple[int, int, int],
    input_ids: Any,
    attention_mask: Any,
    labels: Any,
    hidden_states: Any,
) -> None:
    """What `MedusaForCausalLM.forward` reads: token ids and labels as 2D integer tensors within the vocabulary,
    a mask of their shape, cached states as wide as the heads read.

    Args:
        sizes (`tuple[int, int, int]`): the cached states' width (the base's hidden size, times the states EAGLE-3
            heads read), the base's number of logits and its number of embedded ids.
    """
    hidden_size, vocab_size, embedded = sizes
    fits = isinstance(hidden_states, torch.Tensor) and hidden_states.dim() == 3
    if hidden_states is not None and not (fits and hidden_states.shape[-1] == hidden_size):
        got = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
        raise ValueError(
            f"`hidden_states` must be the base's hidden states the heads read (its last one; for EAGLE-3 heads, the "
            f"layers they fuse and then the last, concatenated), of shape (batch, sequence, {hidden_size}); got {got}."
        )
    _check_ids("input_ids", input_ids, embedded, "ids the base embeds")
    _check_ids("labels", labels, vocab_size, "the base's logits", ignored=IGNORE_INDEX)
    shape = next((tuple(t.shape[:2]) for t in (input_ids, hidden_states, labels) if t is not None), None)
    for name, value in (("labels", labels), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"`{name}` must be a tensor of shape (batch, sequence), got {type(value).__name__}.")
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(f"`{name}` must hold one value per token, of shape {shape}; got {tuple(value.shape)}.")


def _check_ids(name: str, value: Any, limit: int, what: str, ignored: int | None = None) -> None:
    """`value`: `None`, or a 2D integer tensor of ids in [0, `limit`) (or `ignored`)."""
    if value is None:
        return
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype.is_complex:
        raise TypeError(f"`{name}` must be a tensor of integer token ids, got {_describe(value)}.")
    if value.dtype == torch.bool:
        raise TypeError(f"`{name}` must be a tensor of integer token ids, got {_describe(value)}.")
    if value.dim() != 2:
        raise ValueError(f"`{name}` must be a 2D tensor (batch, sequence) of token ids, got {_describe(value)}.")
    kept = value if ignored is None else value[value != ignored]
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= limit):
        also = "" if ignored is None else f" (or {ignored} where no loss applies)"
        raise ValueError(
            f"`{name}` holds ids outside [0, {limit}), the {what}{also}: found {int(kept.min())} to "
            f"{int(kept.max())}. Encode with the base's own tokenizer."
        )


def check_objective_settings(
    head_decay: Any, soft_targets: Any, distill_weight: Any, rank_top_k: Any, feature_weight: Any
) -> None:
    """The training objective's settings (see `MedusaForCausalLM.forward`)."""
    if not isinstance(soft_targets, bool):
        raise TypeError(f"`soft_targets` must be True or False, got {soft_targets!r} ({type(soft_targets).__name__}).")
    if not isinstance(rank_top_k, int) or isinstance(rank_top_k, bool):
        raise TypeError(f"`rank_top_k` must be an int >= 0, got {rank_top_k!r} ({type(rank_top_k).__name__}).")
    if rank_top_k < 0:
        raise ValueError(f"`rank_top_k` must be an int >= 0, got {rank_top_k!r}.")
    _check_number("head_decay", head_decay, "a number in (0, 1]", lambda x: 0.0 < x <= 1.0)
    for name, value in (("distill_weight", distill_weight), ("feature_weight", feature_weight)):
        _check_number(name, value, "a number >= 0", lambda x: x >= 0.0)


def _check_number(name: str, value: Any, takes: str, in_range: Callable[[float], bool]) -> None:
    """A finite real number (not a bool) for which `in_range` holds."""
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be {takes}, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value) or not in_range(float(value)):
        raise ValueError(f"`{name}` must be {takes}, got {value!r}.")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
