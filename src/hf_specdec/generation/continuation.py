"""Continuing from a cache (`generate(..., cache=...)` / `past_key_values=`), and leaving it as plain decoding would.

A multi-turn chat passes the cache of the previous turns (a transformers `Cache`, filled by an earlier plain or
speculative call) together with the whole conversation's ids: the first `L` columns are in the cache, the rest
are new. The loop's own cache is seeded with a copy of the cached slots, prefills the new tokens only, and decodes
as usual (holes, compactions, finished rows leaving the batch: none of it touches the caller's cache). At the end
the caller's cache holds what plain `generate()` leaves in it: one slot per column of the returned sequences but
the last, in order.

- Batch size 1, no padding, full attention: the slots of the committed tokens are copied from the loop's cache
  (the loop fed every committed token but the last; its other slots are rejected drafts).
- Otherwise (rows that finished early, which plain decoding keeps feeding padding; padded prompts; sliding
  windows): one forward of the target over the generated tokens on the caller's cache, with the attention mask and
  positions plain decoding uses, writes the slots it would have written.

The draft model's cache is rebuilt from the whole conversation at each call (one prefill of the draft). Drafters
that read the target's hidden states (EAGLE heads, MTP layers) get them for the new columns only, where their own
context then starts (at the true positions): a shorter context, which can lower acceptance, never the tokens.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import (
    Cache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
)

from hf_specdec.generation.kv_cache import CachedSequence

# Layers whose slots this module can read and append to, by exact type: transformers' others (quantised layers,
# which subclass `DynamicLayer` and keep most of their slots elsewhere; indexed, offloaded ones) hold them otherwise.
_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer)


class Continuation:
    """The caller's cache, checked, and how the loop continues from it.

    Args:
        cache (`Cache`): the caller's cache; its first `cache.get_seq_length()` columns of `input_ids` are in it.
        input_ids (`torch.LongTensor` of shape `(batch, length)`): the whole text so far, left-padded.
        attention_mask (`torch.LongTensor` of shape `(batch, length)`): 0 on padding.
        path (`str`): how error messages name the speculative path.

    Raises:
        `ValueError`: for a cache that is not a transformers `Cache`, of another batch size, of layers that
            quantise, offload or wrap around, that holds every column of `input_ids` already, or whose layers keep
            different numbers of slots (full and sliding-window layers, with the text longer than the window).
    """

    def __init__(self, cache: object, input_ids: torch.Tensor, attention_mask: torch.Tensor, path: str) -> None:
        if not isinstance(cache, Cache):
            raise ValueError(
                f"`cache=` takes a transformers Cache (e.g. `DynamicCache()`, or `out.cache` of an earlier call), got "
                f"{type(cache).__name__}."
            )
        self.cache = cache
        self.cached = cache.get_seq_length()
        batch, length = input_ids.shape
        if self.cached >= length:
            raise ValueError(
                f"The cache already holds {self.cached} tokens and `input_ids` has {length}: pass the whole text "
                "so far, with at least one token the cache does not hold (the new turn)."
            )
        layers = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
        kinds = {type(layer).__name__ for layer in cache.layers if type(layer) not in _LAYERS}
        if kinds:
            raise ValueError(
                f"A cache of {sorted(kinds)} layers cannot be continued with {path}: pass a `DynamicCache` (the "
                "default) or a `StaticCache`, or continue this cache with plain `generate()`."
            )
        if any(isinstance(layer, StaticSlidingWindowLayer) and self.cached > layer.max_cache_len for layer in layers):
            raise ValueError(
                f"The static cache's sliding-window layers have wrapped around (the text is longer than their "
                f"window), and {path} cannot continue from them: pass a `DynamicCache` (the default), or continue "
                "this cache with plain `generate()`."
            )
        retained = {self._retained(layer) for layer in layers}
        if len(retained) > 1:
            raise ValueError(
                f"The cache's layers keep different numbers of tokens ({sorted(retained)}: full and sliding-window "
                f"layers), which {path} cannot continue from. Continue this conversation with plain `generate()`, "
                "or call without `cache=` (the whole text is then prefilled)."
            )
        if layers and layers[0].keys.shape[0] != batch:
            raise ValueError(
                f"The cache holds {layers[0].keys.shape[0]} rows but `input_ids` has {batch}: pass the cache of "
                "these same rows."
            )
        self.retained = retained.pop() if retained else 0
        self.input_ids, self.attention_mask = input_ids, attention_mask

    def _retained(self, layer: object) -> int:
        """How many of the cached tokens `layer` still holds (a sliding-window layer keeps its window only)."""
        if isinstance(layer, StaticLayer):
            return self.cached
        return int(layer.keys.shape[-2])  # type: ignore[attr-defined]

    def seed(self, target: CachedSequence, positions: torch.Tensor) -> None:
        """Give the loop's cache (empty) a copy of the cached slots, with their validity and `positions` (the
        logical positions of every column of `input_ids`)."""
        if not self.retained:
            return
        for index, layer in enumerate(self.cache.layers):
            # A dynamic layer holds exactly its retained slots (checked); a static one, the first `cached` of its own.
            held = self.cached if isinstance(layer, StaticLayer) else None
            keys, values = layer.keys[:, :, :held], layer.values[:, :, :held]  # type: ignore[attr-defined]
            target.cache.update(keys.clone(), values.clone(), index)
        first = self.cached - self.retained
        target.valid = self.attention_mask[:, first : self.cached].bool()
        if target.layout.sliding_window is not None:  # the loop's cache keeps positions for the window's mask
            target.positions = positions[:, first : self.cached]

    def prefilled(self, target: CachedSequence) -> None:
        """Append to the caller's cache the slots the loop's prefill wrote (the new columns, in order)."""
        self._append(target, torch.arange(self.retained, target.num_slots, device=target.valid.device))

    def finish(self, model: PreTrainedModel, target: CachedSequence, sequences: torch.Tensor) -> Cache:
        """Leave in the caller's cache one slot per column of `sequences` but the last, as plain decoding does;
        return it."""
        prompt, end = self.input_ids.shape[1], sequences.shape[1] - 1
        if end <= prompt:
            return self.cache
        unpadded = bool(self.attention_mask.bool().all())
        if sequences.shape[0] == 1 and unpadded and target.layout.sliding_window is None:
            # Every slot the loop kept valid holds a committed token, in order (rejected drafts are holes), up to
            # the last committed token, which was never fed; slots past it hold drafts past an EOS or the limit.
            # (Full attention: the loop's cache holds every column from the first on.) The valid slots, in order,
            # without reading how many there are.
            order = torch.argsort(~target.valid[0], stable=True)
            self._append(target, order[prompt:end])
            return self.cache
        mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(sequences.shape[0], end - prompt)], dim=1)
        positions = (mask.long().cumsum(dim=1) - 1).masked_fill(mask == 0, 1)
        extra = {"logits_to_keep": 1} if target.takes_logits_to_keep else {}
        model(
            input_ids=sequences[:, prompt:end],
            attention_mask=mask,
            position_ids=positions[:, prompt:],
            cache=self.cache,
            use_cache=True,
            **extra,
        )
        return self.cache

    def _append(self, target: CachedSequence, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        for index, layer in enumerate(target.cache.layers):
            if getattr(layer, "keys", None) is None:
                continue
            keys = layer.keys.index_select(2, slots)
            values = layer.values.index_select(2, slots)
            self.cache.update(keys, values, index)
