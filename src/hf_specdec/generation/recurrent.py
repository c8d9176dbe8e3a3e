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
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    LinearAttentionCacheLayerMixin,
    StaticLayer,
    get_layer_types_and_kwargs,
)

from hf_specdec.generation.recurrent_layers import (
    RecordingLinearAttentionAndFullAttentionLayer,
    RecordingLinearAttentionAndStaticFullAttentionLayer,
    RecordingLinearAttentionLayer,
    RecordsInPlace,
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
    if len(types) != len(kwargs):
        raise ValueError(
            f"{type(model).__name__}'s config gives {len(types)} layer types for {len(kwargs)} layers, so its cache "
            "cannot be laid out (a model cut to its first layers by `assistant_early_exit` whose config keeps other "
            "per-layer lists): draft with another model."
        )
    layers = []
    for kind, extra in zip(types, kwargs, strict=True):
        states = extra.get("number_of_states", 1)
        if kind in RECURRENT_LAYER_TYPES:
            layers.append(RecordingLinearAttentionLayer(number_of_states=states))
        elif kind in MIXED_LAYER_TYPES:
            layers.append(
                RecordingLinearAttentionAndFullAttentionLayer(number_of_states=states)
                if capacity is None
                else RecordingLinearAttentionAndStaticFullAttentionLayer(
                    max_cache_len=capacity, number_of_states=states
                )
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


@dataclass
class _Forward:
    """One recorded forward of `width` tokens: its validity `(B, width)` (each row's real tokens first; `None`: all
    real), and per recurrent layer and state index the convolution's inputs `(B, C, kernel + width)` (the window
    before, then the new columns). Its recurrent states are in the layers' buffers (`RecordsInPlace`)."""

    width: int
    valid: torch.Tensor | None
    conv: list[dict[int, torch.Tensor]]


class RecurrentStates:
    """The recurrent layers of a cache, with the state after every real token fed since the last decision.

    Call `record(width)` before a forward of `width` tokens (after the first one) and `fed(new_valid, width)` after
    it; `keep(num_keep, num_new)` gives each row the state after the tokens it keeps. Each layer keeps the state after
    every column fed in the step in its buffer (`RecordsInPlace`): slot n, the state after n columns (the last, the
    layer's own). A target's decision, right after its one verify forward, copies each row's state alone
    (`real_kept`); a draft's, after several forwards, gathers them.
    """

    def __init__(self, cache: Cache, model_name: str) -> None:
        self.layers = [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
        if not all(isinstance(layer, RecordsInPlace) for layer in self.layers):
            raise TypeError("RecurrentStates records through the layers of `recurrent_cache`.")
        self.model_name = model_name
        self._forwards: list[_Forward] = []

    @property
    def _fed_columns(self) -> int:
        return sum(forward.width for forward in self._forwards)

    def record(self, width: int) -> None:
        """Have the next forward (of `width` tokens) record the state after each of them."""
        if self._forwards:
            self._close(self._forwards[-1])
        for layer in self.layers:
            if not self._forwards:
                layer.start_step()  # type: ignore[attr-defined]
            layer.snapshot()  # type: ignore[attr-defined]
            layer.record_past = True
            layer.recurrent_states_to_keep = width

    def fed(self, new_valid: torch.Tensor | None, width: int) -> None:
        """Take what the forward just run left (`new_valid` `(batch, width)`: its real tokens first in every row;
        `None`: all real)."""
        conv: list[dict[int, torch.Tensor]] = []
        columns = self._fed_columns + width
        for layer in self.layers:
            conv.append({})
            for i in range(layer.number_of_states):
                if layer.is_conv_states_initialized[i]:
                    inputs = layer.conv_states[i]  # (B, C, kernel + width)
                    if inputs.shape[-1] != layer.conv_kernel_size[i] + width:
                        raise self._unrecorded()
                    conv[-1][i] = inputs
                    layer.conv_states[i] = inputs[..., width:]  # rows whose tokens are all real: their window
                if layer.is_recurrent_states_initialized[i] and layer.recorded[i] != columns:  # type: ignore[attr-defined]
                    raise self._unrecorded()  # the layer stepped only some tokens one by one
        self._forwards.append(_Forward(width, new_valid, conv))

    def _close(self, forward: _Forward) -> None:
        """Before the next forward of the step: take each row back to its last real token of `forward` (the last
        forward recorded), so that padding never enters a row's state."""
        if forward.valid is None:
            return
        real = forward.valid.long().sum(dim=1)  # (B,)
        start = self._fed_columns - forward.width
        for number, layer in enumerate(self.layers):
            for i in self._recurrent_indices(layer):
                states = self._states(layer, i, start)  # (1 + width, B, ...)
                layer.recurrent_states[i].copy_(_rows_at(states, real))
            for i, inputs in forward.conv[number].items():
                layer.conv_states[i] = _rows_at(_windows(inputs, layer.conv_kernel_size[i]), real).contiguous()

    def keep(self, num_keep: torch.Tensor, num_new: int, real_kept: list[int] | None = None) -> None:
        """Give each row the state after the tokens it keeps: of the last `num_new` columns fed since the last
        decision, the first `num_keep[b]` `(batch,)`, and every column before them (padding among them counts as
        a column, not as a token). `real_kept`: the same counts on the host, when the caller knows every kept column
        holds a real token."""
        if not self._forwards:
            return
        if real_kept is not None and len(self._forwards) == 1 and num_new == self._forwards[0].width:
            self._keep_each_row(self._forwards[0], real_kept)
        else:
            self._keep_gathered(num_keep, num_new)
        self.forget()

    def _keep_each_row(self, forward: _Forward, real_kept: list[int]) -> None:
        """`keep` after one forward, each row's count known: copy each row's state, or leave it where it is last."""
        for number, layer in enumerate(self.layers):
            for i in self._recurrent_indices(layer):
                for row, count in enumerate(real_kept):
                    if count < forward.width:
                        layer.recurrent_states[i][row].copy_(layer.buffers[i][count, row])  # type: ignore[attr-defined]
            for i, inputs in forward.conv[number].items():
                kernel = layer.conv_kernel_size[i]
                layer.conv_states[i] = torch.stack(
                    [inputs[row, :, count : count + kernel] for row, count in enumerate(real_kept)]
                )

    def _keep_gathered(self, num_keep: torch.Tensor, num_new: int) -> None:
        """`keep` from every recorded state, indexed on the device."""
        device = num_keep.device
        valid = torch.cat(
            [
                f.valid
                if f.valid is not None
                else torch.ones(num_keep.shape[0], f.width, dtype=torch.bool, device=device)
                for f in self._forwards
            ],
            dim=1,
        ).to(device)  # (B, F)
        if num_new > valid.shape[1]:
            raise ValueError(
                f"{self.model_name}: a decision reaches back past the tokens whose recurrent states were recorded."
            )
        columns = valid.shape[1] - num_new + num_keep  # (B,)
        offsets = torch.arange(valid.shape[1], device=device)
        count = valid.long().cumsum(dim=1)  # (B, F) real tokens up to each column
        kept = torch.where(offsets[None, :] < columns[:, None], valid, False).long().sum(dim=1)  # (B,)
        # The state after row b's kept-th real token: after the column holding it (the state before the step: 0).
        column = (count < kept[:, None]).long().sum(dim=1)  # (B,) the column of that token
        index = torch.where(kept > 0, column + 1, 0)
        for number, layer in enumerate(self.layers):
            for i in self._recurrent_indices(layer):
                layer.recurrent_states[i].copy_(_rows_at(self._states(layer, i, 0), index))
            for i in self._forwards[0].conv[number]:
                kernel = layer.conv_kernel_size[i]
                windows = [_windows(f.conv[number][i], kernel) for f in self._forwards]
                windows = torch.cat([windows[0][:1], *(w[1:] for w in windows)], dim=0)  # (1 + F, B, C, kernel)
                layer.conv_states[i] = _rows_at(windows, index).contiguous()

    def _states(self, layer: LinearAttentionCacheLayerMixin, i: int, start: int) -> torch.Tensor:
        """The states `(1 + columns, B, ...)` after columns `start`, `start + 1`, ... of the step, the last the
        layer's own."""
        recorded = layer.buffers[i][start : layer.recorded[i]]  # type: ignore[attr-defined]
        return torch.cat([recorded, layer.recurrent_states[i][None]], dim=0)

    @staticmethod
    def _recurrent_indices(layer: LinearAttentionCacheLayerMixin) -> list[int]:
        return [i for i in range(layer.number_of_states) if layer.is_recurrent_states_initialized[i]]

    def forget(self) -> None:
        """Drop the step's record (after a decision)."""
        self._forwards = []

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep the given rows of the batch, in this order (repeated rows: copies), with what they recorded since
        the last decision."""
        for number, layer in enumerate(self.layers):
            for i in range(layer.number_of_states):
                if layer.is_conv_states_initialized[i]:
                    layer.conv_states[i] = layer.conv_states[i][rows]
                if layer.is_recurrent_states_initialized[i]:
                    layer.recurrent_states[i] = layer.recurrent_states[i][rows]
                    if self._forwards:
                        layer.buffers[i] = layer.buffers[i][:, rows]  # type: ignore[attr-defined]
            for forward in self._forwards:
                forward.conv[number] = {i: inputs[rows] for i, inputs in forward.conv[number].items()}
        for forward in self._forwards:
            if forward.valid is not None:
                forward.valid = forward.valid[rows]

    def drop(self, tokens: int) -> None:
        """Count `tokens` fewer in the layers' token counters (slots cropped from every row's cache)."""
        for layer in self.layers:
            layer.cumulative_length_linear.sub_(tokens)

    def _unrecorded(self) -> ValueError:
        return ValueError(_UNRECORDED.format(name=self.model_name))


def _windows(inputs: torch.Tensor, kernel: int) -> torch.Tensor:
    """The convolution windows `(1 + width, B, C, kernel)` before a forward and after each of its columns, of its
    inputs `(B, C, kernel + width)`."""
    return inputs.unfold(-1, kernel, 1).permute(2, 0, 1, 3)


def _rows_at(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`out[b] = states[index[b], b]` for states `(T, B, ...)` and an index `(B,)`."""
    rows = torch.arange(states.shape[1], device=states.device)
    return states[index.to(states.device), rows]
