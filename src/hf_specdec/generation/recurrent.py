"""Recurrent layer states (linear attention, state space models, short convolutions) rolled back row by row.

Hybrid models (Qwen3.5, Qwen3-Next, Jamba, Bamba, Nemotron-H, Granite-4.0-H, Falcon-H1, ...) and pure state space
models (Mamba, Mamba2) keep, for every recurrent layer, a fixed-size state per row instead of one cache slot per
token: a convolution window (the layer's last `kernel` inputs) and, for most, a recurrent matrix. A rejected draft
cannot be masked out of such a state as it can from an attention cache: each row must get back the state it had
after its own accepted tokens.

transformers (>= 5.25) computes those states during the forward that verifies a chain, at no extra forward: with
its cache's "past recording" on, a layer fed `q` tokens keeps the convolution inputs of all of them and steps its
recurrence one token at a time over the last `recurrent_states_to_keep`, keeping the state after each. This module
asks every forward for all of them, stacks them per token, and after acceptance gives each row the state after its
own number of accepted tokens: one gather per layer, whatever the rows accepted (ragged, as the attention slots).

Within a step a row may be fed padding (a row with fewer tokens to catch up than others): its real tokens are
moved ahead of its padding before the forward (`valid_first`), and after the forward its state is taken back to
its last real token, so padding never enters a recurrent state. The first forward (the prompts) is fed as plain
`generate()` feeds it: left padding zeroed by the 2D mask the model applies to its recurrent layers.
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndStaticFullAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
    StaticLayer,
    get_layer_types_and_kwargs,
)

# Layer types (transformers' `layer_types` spelling) whose cache keeps a recurrent or convolution state.
RECURRENT_LAYER_TYPES = {"linear_attention", "conv"}
# Layers carrying both a recurrent state and attention keys and values.
MIXED_LAYER_TYPES = {"hybrid", "hybrid_sliding"}
# Layers with attention alone, and layers with no cache at all.
ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}
STATELESS_LAYER_TYPES = {"moe", "mlp", "dummy"}


def layer_types(model: PreTrainedModel) -> list[str]:
    """The cache layer type of every decoder layer of `model`, as transformers' caches read them from its config."""
    config = model.config.get_text_config(decoder=True)
    return list(get_layer_types_and_kwargs(config)[0])


@functools.lru_cache(maxsize=64)
def _has_recurrent_layers(types: tuple[str, ...]) -> bool:
    return bool(set(types) & (RECURRENT_LAYER_TYPES | MIXED_LAYER_TYPES))


def has_recurrent_layers(model: PreTrainedModel) -> bool:
    """Whether some layer of `model` keeps a recurrent or convolution state (a hybrid or a state space model)."""
    try:
        types = layer_types(model)
    except (AttributeError, TypeError, ValueError):
        return False
    return _has_recurrent_layers(tuple(types))


def has_attention_layers(model: PreTrainedModel) -> bool:
    """Whether some layer of `model` attends over a KV cache (False for pure state space models)."""
    return bool(set(layer_types(model)) & (ATTENTION_LAYER_TYPES | MIXED_LAYER_TYPES))


def check_recorded(model: PreTrainedModel) -> None:
    """Raise `ValueError` for a model with recurrent layers whose modelling code does not record the state after
    each token of a forward (transformers' `get_recurrent_states_to_keep`): its rejected drafts could not be rolled
    back. Layers of short convolutions alone need no recording (their window holds the inputs)."""
    if not set(layer_types(model)) & ({"linear_attention"} | MIXED_LAYER_TYPES):
        return
    if not _records_states(type(model).__module__):
        raise ValueError(_UNRECORDED.format(name=type(model).__name__))


@functools.lru_cache(maxsize=64)
def _records_states(module_name: str) -> bool:
    """Whether a modelling module asks its cache how many per-token recurrent states to keep."""
    module = sys.modules.get(module_name)
    try:
        return module is not None and "get_recurrent_states_to_keep" in inspect.getsource(module)
    except (OSError, TypeError):  # no source to read: the first verify forward tells (`RecurrentStates.fed`)
        return True


_UNRECORDED = (
    "{name} does not keep the state of its recurrent layers after each token of a forward in this version of "
    "transformers, so a rejected draft cannot be rolled back. Decode this model with plain `generate()`."
)


def recurrent_cache(model: PreTrainedModel, capacity: int | None = None) -> Cache:
    """A cache for a model with recurrent layers: recurrent layers' states where its config says, attention layers
    keeping every slot (sliding-window ones included: the window is applied by the mask, as for attention-only
    models), static ones of `capacity` slots when given."""
    config = model.config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(config)
    layers = []
    for kind, extra in zip(types, kwargs, strict=True):
        states = extra.get("number_of_states", 1)
        if kind in RECURRENT_LAYER_TYPES:
            layers.append(LinearAttentionLayer(number_of_states=states))
        elif kind in MIXED_LAYER_TYPES:
            layers.append(
                LinearAttentionAndFullAttentionLayer(number_of_states=states)
                if capacity is None
                else LinearAttentionAndStaticFullAttentionLayer(max_cache_len=capacity, number_of_states=states)
            )
        elif kind in ATTENTION_LAYER_TYPES:
            layers.append(DynamicLayer() if capacity is None else StaticLayer(max_cache_len=capacity))
        elif kind in STATELESS_LAYER_TYPES:
            layers.append(DummyLayer())
        else:
            raise ValueError(
                f"{type(model).__name__} has layers of type {kind!r}, whose cached state speculative decoding cannot "
                "roll back to an earlier token. Decode this model with plain `generate()`."
            )
    return Cache(layers=layers)


def valid_first(new_valid: torch.Tensor) -> torch.Tensor:
    """Per row, the order `(batch, q)` that puts its real new tokens first, in their order, then its padding: a
    recurrent layer reads its inputs in column order, so padding must come last to stay out of the state."""
    return torch.argsort((~new_valid).to(torch.int8), dim=1, stable=True)


class RecurrentStates:
    """The recurrent layers of a cache, with the state after every real token fed since the last decision.

    Call `record(width)` before a forward of `width` tokens (after the first one) and `fed(new_valid)` after it;
    `keep(columns)` gives each row the state after the tokens it keeps and forgets the rest.
    """

    def __init__(self, cache: Cache, model_name: str) -> None:
        self.layers = [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
        self.model_name = model_name
        self.recording = False
        # Per layer and state index: the convolution windows and recurrent states after each fed column, the state
        # before them first, `(1 + columns, batch, ...)` per forward, and the validity of the fed columns `(B, F)`.
        self._conv: list[dict[int, list[torch.Tensor]]] = [{} for _ in self.layers]
        self._recurrent: list[dict[int, list[torch.Tensor]]] = [{} for _ in self.layers]
        self._valid: list[torch.Tensor] = []

    def record(self, width: int) -> None:
        """Have the next forward (of `width` tokens) keep the state after each of them."""
        self.recording = True
        for layer in self.layers:
            layer.record_past = True
            layer.recurrent_states_to_keep = width
            layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}

    def fed(self, new_valid: torch.Tensor) -> None:
        """Collect the states after each column of the forward just run `(batch, q)` of validity, its real tokens
        first in every row, and take every row's state back to its last real token."""
        width = new_valid.shape[1]
        real = new_valid.long().sum(dim=1)  # (B,)
        for index, layer in enumerate(self.layers):
            for i in range(layer.number_of_states):
                if layer.is_conv_states_initialized[i]:
                    conv = layer.conv_states[i]  # (B, C, kernel + q): the window before, then the new inputs
                    kernel = layer.conv_kernel_size[i]
                    windows = conv.unfold(-1, kernel, 1)  # (B, C, q + 1, kernel): the window after 0..q tokens
                    if windows.shape[2] != width + 1:
                        raise self._unrecorded()
                    windows = windows.permute(2, 0, 1, 3)  # (q + 1, B, C, kernel)
                    self._conv[index].setdefault(i, []).append(windows)
                    layer.conv_states[i] = _rows_at(windows, real).contiguous()
                if layer.is_recurrent_states_initialized[i]:
                    history = layer.recurrent_states_history[i]
                    if len(history) != width:  # the layer stepped only some tokens one by one
                        raise self._unrecorded()
                    states = torch.stack([*history, layer.recurrent_states[i]])  # (q + 1, B, ...)
                    self._recurrent[index].setdefault(i, []).append(states)
                    layer.recurrent_states[i].copy_(_rows_at(states, real))
                    layer.recurrent_states_history[i] = []
        self._valid.append(new_valid)

    def keep(self, num_keep: torch.Tensor, num_new: int) -> None:
        """Give each row the state after the tokens it keeps: of the last `num_new` columns fed since the last
        decision, the first `num_keep[b]` `(batch,)`, and every column before them (padding among them counts as
        a column, not as a token)."""
        if not self._valid:
            return
        valid = torch.cat(self._valid, dim=1)  # (B, F)
        if num_new > valid.shape[1]:
            raise ValueError(
                f"{self.model_name}: a decision reaches back past the tokens whose recurrent states were recorded."
            )
        columns = valid.shape[1] - num_new + num_keep.to(valid.device)  # (B,)
        offsets = torch.arange(valid.shape[1], device=valid.device)
        count = valid.long().cumsum(dim=1)  # (B, F) real tokens up to each column
        kept = torch.where(offsets[None, :] < columns[:, None], valid, False).long().sum(dim=1)  # (B,)
        # The state after row b's kept-th real token: after the column holding it (the state before the step: 0).
        column = (count < kept[:, None]).long().sum(dim=1)  # (B,) the column of that token
        index = torch.where(kept > 0, column + 1, 0)
        for number, layer in enumerate(self.layers):
            for i, parts in self._conv[number].items():
                layer.conv_states[i] = _rows_at(_after_columns(parts), index).contiguous()
            for i, parts in self._recurrent[number].items():
                layer.recurrent_states[i].copy_(_rows_at(_after_columns(parts), index))
        self.forget()

    def forget(self) -> None:
        """Drop the recorded states (after a decision, or a forward whose states no row can go back to)."""
        self._conv = [{} for _ in self.layers]
        self._recurrent = [{} for _ in self.layers]
        self._valid = []

    def pending(self) -> bool:
        """Whether tokens were fed since the last decision."""
        return bool(self._valid)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows of the batch (between steps: nothing recorded)."""
        for layer in self.layers:
            for i in range(layer.number_of_states):
                if layer.is_conv_states_initialized[i]:
                    layer.conv_states[i] = layer.conv_states[i][rows]
                if layer.is_recurrent_states_initialized[i]:
                    layer.recurrent_states[i] = layer.recurrent_states[i][rows]
        self._valid = [valid[rows] for valid in self._valid]
        self._conv = [{i: [p[:, rows] for p in parts] for i, parts in d.items()} for d in self._conv]
        self._recurrent = [{i: [p[:, rows] for p in parts] for i, parts in d.items()} for d in self._recurrent]

    def drop(self, tokens: int) -> None:
        """Count `tokens` fewer in the layers' token counters (slots cropped from every row's cache)."""
        for layer in self.layers:
            layer.cumulative_length_linear.sub_(tokens)

    def _unrecorded(self) -> ValueError:
        return ValueError(_UNRECORDED.format(name=self.model_name))


def _after_columns(parts: list[torch.Tensor]) -> torch.Tensor:
    """The states `(1 + F, B, ...)` before a step and after each column it fed, from each forward's `(1 + q, B,
    ...)` (a later forward's first entry, its rows' state before it, is the earlier one's at their last real
    token: dropped)."""
    return torch.cat([parts[0][:1], *(part[1:] for part in parts)], dim=0)


def _rows_at(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`out[b] = states[index[b], b]` for states `(T, B, ...)` and an index `(B,)`."""
    rows = torch.arange(states.shape[1], device=states.device)
    return states[index.to(states.device), rows]
