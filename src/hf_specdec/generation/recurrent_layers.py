"""transformers' recurrent cache layers, recording the state after every token of a step into one buffer.

transformers' own recording keeps a fresh copy of a layer's state per token fed (`recurrent_states_history`), all
alive until a decision drops them: at batch 4 and 8 tokens a step, a 0.8B hybrid allocates and frees half a
gigabyte a step, and freeing it alone cost 8% of a step on a CPU. These layers copy each state into a buffer kept
from step to step instead (`recorded`), so the per-token states the recurrence computes are freed at once and their
memory reused by the next layer. Everything else is transformers' layer as it is.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import (
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndStaticFullAttentionLayer,
    LinearAttentionLayer,
)


class RecordsInPlace:
    """Records a recurrent layer's states into `buffers[i]` `(slots, *state)`: while `record_past` is on, slot n
    holds the state after the step's first n tokens, for n below `recorded[i]` (the state after every token fed so
    far is the layer's own `recurrent_states[i]`)."""

    recurrent_states: dict[int, torch.Tensor | None]
    is_recurrent_states_initialized: dict[int, bool]
    record_past: bool
    number_of_states: int

    def start_step(self) -> None:
        """Forget what the last step recorded (the buffers stay, to be written over)."""
        self.recorded = dict.fromkeys(range(self.number_of_states), 0)
        if not hasattr(self, "buffers"):
            self.buffers: dict[int, torch.Tensor] = {}

    def snapshot(self) -> None:
        """Before a forward: keep the state before its first token (some layers, Mamba's, step the cache's own
        state in place during the forward, before handing it their per-token states)."""
        for state_idx in range(self.number_of_states):
            current = self.recurrent_states[state_idx]
            if current is not None and self.is_recurrent_states_initialized[state_idx]:
                start = self.recorded[state_idx]
                self._buffer(state_idx, start + 1, current)[start].copy_(current)

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor | list[torch.Tensor], state_idx: int = 0, **kwargs: object
    ) -> torch.Tensor:
        if not self.record_past:
            return super().update_recurrent_state(recurrent_states, state_idx, **kwargs)  # type: ignore[misc]
        first = recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[0]
        if not self.is_recurrent_states_initialized[state_idx]:
            self.lazy_initialization(recurrent_states=first, state_idx=state_idx)  # type: ignore[attr-defined]
        history = [] if isinstance(recurrent_states, torch.Tensor) else recurrent_states[:-1]
        last = recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[-1]
        current = self.recurrent_states[state_idx]
        assert current is not None
        start = self.recorded[state_idx]  # slot `start` holds the state before this forward (`snapshot`)
        buffer = self._buffer(state_idx, start + 1 + len(history), current)
        for offset, state in enumerate(history):
            buffer[start + 1 + offset].copy_(state)
        self.recorded[state_idx] = start + 1 + len(history)
        current.copy_(last)
        return current

    def _buffer(self, state_idx: int, slots: int, like: torch.Tensor) -> torch.Tensor:
        """The buffer of state `state_idx`, holding at least `slots` states (grown, keeping what it holds)."""
        buffer = self.buffers.get(state_idx)
        if buffer is not None and (buffer.shape[1:] != like.shape or buffer.dtype != like.dtype):
            buffer = None  # another batch at a step's start (rows left, or a tree's paths): nothing to keep
        if buffer is None or buffer.shape[0] < slots:
            grown = like.new_empty((max(slots, 2 * (0 if buffer is None else buffer.shape[0])), *like.shape))
            if buffer is not None:  # the states recorded, and the one `snapshot` keeps after them
                kept = min(buffer.shape[0], self.recorded[state_idx] + 1)
                grown[:kept] = buffer[:kept]
            self.buffers[state_idx] = buffer = grown
        return buffer


class RecordingLinearAttentionLayer(RecordsInPlace, LinearAttentionLayer):
    """transformers' `LinearAttentionLayer`, recording in place (see `RecordsInPlace`)."""


class RecordingLinearAttentionAndFullAttentionLayer(RecordsInPlace, LinearAttentionAndFullAttentionLayer):
    """transformers' `LinearAttentionAndFullAttentionLayer`, recording in place (see `RecordsInPlace`)."""


class RecordingLinearAttentionAndStaticFullAttentionLayer(RecordsInPlace, LinearAttentionAndStaticFullAttentionLayer):
    """transformers' `LinearAttentionAndStaticFullAttentionLayer`, recording in place (see `RecordsInPlace`)."""
