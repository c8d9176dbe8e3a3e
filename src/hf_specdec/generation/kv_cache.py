"""All coupling to the transformers cache API lives here.

A `CachedSequence` is one model's view of a batch being decoded: its `DynamicCache`, plus per-slot
bookkeeping that lets every row keep its own number of tokens without ever re-running the prefill.

Rows of a batch accept different numbers of drafted tokens in a step. Instead of moving KV entries around,
the cache keeps one slot per token fed to the model for every row, crops the slots that no row kept, and
marks the rest invalid for the rows that rejected them ("holes"). Holes are masked out of attention like
left padding, and logical `position_ids` skip them, so every row computes exactly what it would alone.
When holes take up too much of the cache, `compact` squeezes them out in one gather.

With `cache_implementation="static"` the slots live in preallocated tensors (transformers' `StaticLayer`), every
forward sees all of them under a mask of fixed width, and a compiled forward (`compile`) pads the tokens it is fed
to a few bucketed widths (`bucket`), so that `torch.compile` (and CUDA graphs) see a bounded set of shapes.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import ModelOutput

from hf_specdec.generation.positions import slot_indexed_mask_size
from hf_specdec.generation.readback import HostReads
from hf_specdec.generation.recurrent import (
    MIXED_LAYER_TYPES,
    RECURRENT_LAYER_TYPES,
    STATELESS_LAYER_TYPES,
    RecurrentStates,
    has_recurrent_layers,
    recurrent_cache,
    valid_first,
)
from hf_specdec.trees.masks import additive_mask, to_additive, visibility

_SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"} | RECURRENT_LAYER_TYPES | MIXED_LAYER_TYPES
_SUPPORTED_LAYER_TYPES |= STATELESS_LAYER_TYPES
# How each kind of layer attends: recurrent layers and layers without a cache do not.
_ATTENTION_OF_LAYER = {
    "full_attention": "full_attention",
    "hybrid": "full_attention",
    "sliding_attention": "sliding_attention",
    "hybrid_sliding": "sliding_attention",
}

# Compact a cache once holes make up this share of its slots, and at least MIN_WASTE slots.
COMPACT_FRACTION = 0.25
MIN_WASTE = 32
# A static cache holds `max_length` slots plus this many, so that a step's drafted nodes fit beside a full
# sequence without a compaction; a wider forward grows it (and recompiles a compiled forward once).
STATIC_HEADROOM = 64
# Graphs `torch.compile` may keep per code object while the loop runs compiled: a target's and a draft's width
# buckets (about 2 * log2(widest) each), plain decoding's, and those of other models of the same class.
RECOMPILE_LIMIT = 64
# Static caches are sized in multiples of this many slots (fewer sizes: fewer compiled graphs across calls).
STATIC_ROUNDING = 128
# Where a model remembers the size of its last static cache (see `static_capacity`).
_CAPACITY_ATTRIBUTE = "_hf_specdec_static_capacity"
# transformers' names for a cache of preallocated, fixed-size tensors (the deprecated ones included: the layer
# structure is the model's either way, and here every layer keeps every slot, see `CachedSequence`).
STATIC_CACHE_IMPLEMENTATIONS = (
    "static",
    "sliding_window",
    "hybrid",
    "hybrid_chunked",
)


def bucket(width: int) -> int:
    """The width a compiled forward is fed for `width` new tokens: the next of 1, 2, 3, 4, 6, 8, 12, 16, 24, ...
    (powers of two and their midpoints), so that a generation compiles at most about `2 * log2(widest)` shapes
    and pads a forward by less than half."""
    if width <= 2:
        return max(width, 1)
    power = 1 << (width - 1).bit_length()  # the next power of two
    return power * 3 // 4 if width <= power * 3 // 4 else power


def static_slots(length: int) -> int:
    """Slots of a static cache for sequences of `length` tokens: room for a step's drafted nodes beside them
    (`STATIC_HEADROOM`), rounded up to a multiple of `STATIC_ROUNDING`."""
    return -(-(length + STATIC_HEADROOM) // STATIC_ROUNDING) * STATIC_ROUNDING


def static_capacity(generation_config: GenerationConfig, model: torch.nn.Module) -> int | None:
    """Slots of `model`'s static cache for this call (`cache_implementation="static"`), `None` for a dynamic cache.

    The longest sequence plus room for a step's drafted nodes, rounded up to a multiple of `STATIC_ROUNDING`, or
    `max_cache_len` when that is more; and never less than the model's previous call used: a compiled forward
    sees the cache's size in its mask, so calls whose prompts differ share one size and compile nothing more
    (plain `generate()` keeps its static cache's size across calls the same way)."""
    if generation_config.cache_implementation not in STATIC_CACHE_IMPLEMENTATIONS:
        return None
    needed = max(static_slots(generation_config.max_length), generation_config.max_cache_len or 0)
    capacity = max(needed, getattr(model, _CAPACITY_ATTRIBUTE, 0))
    setattr(model, _CAPACITY_ATTRIBUTE, capacity)
    return capacity


def wants_compile(model: PreTrainedModel, cache: Cache, generation_config: GenerationConfig) -> bool:
    """Whether plain `generate()` would compile this model's decoding forward with this cache: transformers'
    own rule (a compileable cache on an accelerator, or a `compile_config` that asks for every device, and
    `disable_compile` unset), so that speculation is compiled exactly where the baseline it is compared with is."""
    rule = getattr(model, "_valid_auto_compile_criteria", None)
    return bool(rule is not None and rule({"cache": cache}, generation_config))


class AttentionLayout:
    """How a model's layers attend, read once from its config: full, sliding window, or a mix of both; and whether
    some layers keep a recurrent state instead (`recurrent`), or none attend at all (`attends`)."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config.get_text_config(decoder=True)
        layer_types: list[str] | None = getattr(config, "layer_types", None)
        window: int | None = getattr(config, "sliding_window", None)
        self.recurrent = has_recurrent_layers(model)
        if layer_types is not None:
            unknown = set(layer_types) - _SUPPORTED_LAYER_TYPES
            if unknown:
                raise ValueError(
                    f"{type(model).__name__} has layers of type {sorted(unknown)}, whose state cannot be rolled "
                    "back to an earlier token. Speculative decoding supports attention layers (full or sliding "
                    "window) and the recurrent layers of transformers' caches (linear attention, state space "
                    "models, short convolutions); decode this model with plain `generate()`."
                )
            kinds = {_ATTENTION_OF_LAYER[kind] for kind in layer_types if kind in _ATTENTION_OF_LAYER}
        else:
            kinds = {"sliding_attention"} if window is not None else {"full_attention"}
        self.kinds = kinds
        self.mixed = len(kinds) > 1
        self.sliding_window = window if "sliding_attention" in kinds else None
        if self.sliding_window is not None and self.sliding_window < 2:
            raise ValueError(
                f"{type(model).__name__} attends through a sliding window of {self.sliding_window} token(s), where "
                "transformers' cached decoding disagrees with its own full forward, so no speculative result can "
                "match plain decoding. Decode this model with plain `generate()`."
            )
        table = slot_indexed_mask_size(model)
        if table is not None:
            raise ValueError(
                f"{type(model).__name__} masks attention with a causal table of {table} x {table} sliced by the length "
                "of its cache (and applies local attention by cache slot), while speculative decoding keeps drafted "
                "and rejected tokens in the cache and masks by the attention mask it passes. Decode this model with "
                "plain `generate()`, or draft with another model."
            )
        takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        # Whether the model takes positions and masks per layer type (a pure state space model takes neither).
        self.attends = bool(kinds) or takes_positions
        if kinds and (not takes_positions or getattr(config, "alibi", False)):
            raise ValueError(
                f"{type(model).__name__} does not take `position_ids` (or uses ALiBi biases tied to cache slots), so "
                "rows of a batch cannot keep their own positions when they accept different numbers of tokens. "
                "Speculative decoding supports models with rotary or learned absolute positions."
            )
        attn = getattr(model.config, "_attn_implementation", None)
        if attn is not None and attn not in ("sdpa", "eager"):
            raise ValueError(
                f"Speculative decoding passes custom 4D attention masks, which attn_implementation={attn!r} "
                "does not take. Load the model with attn_implementation='sdpa' (the default) or 'eager'."
            )


class CachedSequence:
    """A model's KV cache plus the validity and logical position of every cache slot, per row.

    Attributes:
        cache (`DynamicCache`): the model's cache, one slot per token fed so far (including holes).
        valid (`torch.BoolTensor` of shape `(batch, slots)`): slots that hold a real token of the row.
        positions (`torch.LongTensor` of shape `(batch, slots)`): logical position of each slot's token.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        batch_size: int,
        device: torch.device,
        reads: HostReads | None = None,
        capacity: int | None = None,
    ) -> None:
        self.model = model
        # With `reads`, how many holes the cache has is learnt with the loop's next read instead of at once.
        self.reads = reads
        self._waste = 0  # holes every row has at least (host value, possibly a step old)
        self._slots_measured = 0  # of how many slots, when it was measured
        self._compactions = 0  # a measurement queued before the last compaction is stale
        self.layout = AttentionLayout(model)
        # Full layers always: a sliding-window layer would drop old slots on its own, out of step with `valid`.
        # The window is applied in the mask instead, on logical positions, and slots that left it are compacted
        # away (`forget_out_of_window`).
        # With `capacity`, a static cache of that many slots per layer (it grows if a forward would overflow it).
        self.capacity = capacity
        self.cache: Cache = DynamicCache() if capacity is None else _static_cache(capacity)
        # Models with recurrent layers: a cache laid out from the config, and the recurrent states of every token fed
        # since the last decision (`RecurrentStates`); none of their forwards is compiled (recording the states
        # changes their shapes).
        self.recurrent: RecurrentStates | None = None
        if self.layout.recurrent:
            self.cache = recurrent_cache(model, capacity)
            self.recurrent = RecurrentStates(self.cache, type(model).__name__)
        self._call = model  # the forward of steps after the first: the model, or its compiled call
        self._dtype = model.dtype  # of the masks (`model.dtype` looks through the parameters at every call)
        self.compiled = False
        self.takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        # Logical positions of the slots, which only sliding-window masks read: kept for those models alone.
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        self._windowed = self.layout.sliding_window is not None

    @property
    def num_slots(self) -> int:
        return self.valid.shape[1]

    def compile(self, generation_config: GenerationConfig) -> None:
        """Run every forward after the first through the model's compiled call (`get_compiled_call`, with the
        `compile_config` of `generation_config`), feeding it bucketed widths (see `bucket`). Needs a static cache:
        a growing cache would change shapes at every step."""
        if self.capacity is None:
            raise ValueError("Only a static cache can be compiled: pass cache_implementation='static'.")
        if self.recurrent is not None:  # its cache records a state per token fed in a step: shapes that grow
            return
        # Every model and width bucket compiles a graph of one code object (the models' `__call__`): torch's default
        # limit of 8 per code object would send the rest back to eager without a word.
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        self._call = self.model.get_compiled_call(generation_config.compile_config)
        self.compiled = True

    def _mask(
        self,
        new_valid: torch.Tensor | None,
        new_positions: torch.Tensor,
        structure: torch.Tensor,
        recent: torch.Tensor | None = None,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        dtype = self._dtype
        kv_length = self.capacity  # a static cache's forward attends over all its slots
        if self.recurrent is not None:
            return self._recurrent_masks(new_valid, new_positions, structure, recent)
        if self.layout.sliding_window is None:
            return additive_mask(self.valid, new_valid, structure, dtype, recent, kv_length)
        if new_valid is None:
            new_valid = _all_true(new_positions.shape, new_positions.device)
        key_positions = torch.cat([self.positions, new_positions], dim=1)  # (B, P+q)
        full = self._all_slots(visibility(self.valid, new_valid, structure, recent=recent))  # (B, q, P+q)
        window = visibility(
            self.valid, new_valid, structure, key_positions, new_positions, self.layout.sliding_window, recent
        )
        window = self._all_slots(window)
        if not self.layout.mixed:
            return to_additive(window, dtype)
        return {"full_attention": to_additive(full, dtype), "sliding_attention": to_additive(window, dtype)}

    def _recurrent_masks(
        self,
        new_valid: torch.Tensor | None,
        new_positions: torch.Tensor,
        structure: torch.Tensor,
        recent: torch.Tensor | None,
    ) -> dict[str, torch.Tensor | None] | torch.Tensor | None:
        """The masks of a model with recurrent layers, by layer type: the attention layers' as for any model; the
        recurrent layers' the 2D padding mask of the prompts, as plain `generate()` passes it (later forwards
        feed no padding into a recurrent layer, see `valid_first`). A model without attention takes the 2D mask
        alone."""
        padding = new_valid.long() if new_valid is not None and self.num_slots == 0 else None
        if not self.layout.attends:
            return padding
        layout = self.layout
        masks: dict[str, torch.Tensor | None] = dict.fromkeys(_ATTENTION_OF_LAYER)
        if new_valid is None:
            new_valid = _all_true(new_positions.shape, new_positions.device)
        if "full_attention" in layout.kinds:
            full = self._all_slots(visibility(self.valid, new_valid, structure, recent=recent))
            masks["full_attention"] = masks["hybrid"] = to_additive(full, self._dtype)
        if "sliding_attention" in layout.kinds:
            key_positions = torch.cat([self.positions, new_positions], dim=1)  # (B, P+q)
            window = visibility(
                self.valid, new_valid, structure, key_positions, new_positions, layout.sliding_window, recent
            )
            masks["sliding_attention"] = masks["hybrid_sliding"] = to_additive(self._all_slots(window), self._dtype)
        for kind in RECURRENT_LAYER_TYPES:
            masks[kind] = padding
        return masks

    def _all_slots(self, visible: torch.Tensor) -> torch.Tensor:
        """A static cache's forward attends over all its slots: the ones past the new tokens are hidden."""
        if self.capacity is None:
            return visible
        return torch.nn.functional.pad(visible, (0, self.capacity - visible.shape[-1]), value=False)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        new_valid: torch.Tensor | None,
        new_positions: torch.Tensor,
        structure: torch.Tensor,
        logits_to_keep: int = 0,
        output_hidden_states: bool | int | list[int] = False,
        recent: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> CausalLMOutputWithPast:
        """Run the model on new tokens, appending them to the cache.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch, q)`): the new tokens (any id where not valid); `None`
                with `inputs_embeds`.
            new_valid (`torch.BoolTensor` of shape `(batch, q)`): which new tokens are real (`None`: all of them;
                then `structure` must hold its diagonal, as chains' and trees' do).
            new_positions (`torch.LongTensor` of shape `(batch, q)`): their logical positions.
            structure (`torch.BoolTensor` of shape `(q, q)` or `(batch, q, q)`): ancestor matrix among the new
                tokens (one per row when rows verify different trees).
            logits_to_keep (`int`): compute logits for the last this many tokens only; 0 keeps all.
            output_hidden_states (`bool`, `int` or `list[int]`): also return the hidden states (for heads on the
                last layer); indices (-1: the last) return those alone where the model selects by index.
            recent (`torch.BoolTensor` of shape `(batch, q, S)`, *optional*): which of the last `S` slots each new
                token sees (a tree fed over several forwards, see `masks.visibility`).
            inputs_embeds (`torch.Tensor` of shape `(batch, q, hidden)`, *optional*): the new inputs as vectors
                instead of ids (a decoder fed something other than its own embeddings, as EAGLE heads are).

        Returns:
            The model's `CausalLMOutputWithPast`; `logits` has shape `(batch, q, vocab)`.
        """
        width = new_positions.shape[1]
        first = self.num_slots == 0
        if self.recurrent is not None and not first:
            return self._recurrent_forward(
                input_ids, new_valid, new_positions, structure, logits_to_keep, output_hidden_states, recent,
                inputs_embeds,
            )  # fmt: skip
        all_valid = new_valid is None
        if new_valid is None:
            new_valid = _all_true(new_positions.shape, new_positions.device)
        pad = bucket(width) - width if self.compiled and not first else 0
        if self.capacity is not None:
            self._make_room(width + pad)
        if pad:
            input_ids, inputs_embeds, new_valid, new_positions, structure, recent = _pad_new_tokens(
                pad, input_ids, inputs_embeds, new_valid, new_positions, structure, recent
            )
            if logits_to_keep:
                logits_to_keep += pad
        mask = self._mask(None if all_valid and not pad else new_valid, new_positions, structure, recent)
        extra = {"logits_to_keep": logits_to_keep} if self.takes_logits_to_keep else {}
        inputs = {"input_ids": input_ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        call = self._call_arguments(mask, new_positions)
        if first:
            outputs = self._first_forward(inputs, call, output_hidden_states, extra, width)
        else:
            outputs = self._call(**inputs, **call, output_hidden_states=output_hidden_states, **extra)
        if self.compiled:
            outputs = _own_outputs(outputs, width, pad)
        if pad:
            self.cache.crop(-pad)  # the padding's slots are written over by the next forward
            new_valid, new_positions = new_valid[:, :width], new_positions[:, :width]
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        if self._windowed:
            self.positions = torch.cat([self.positions, new_positions], dim=1)
        return outputs

    def _call_arguments(self, mask: object, positions: torch.Tensor) -> dict:
        """The mask, positions and cache a forward takes (a model without attention takes no positions)."""
        call = {"attention_mask": mask, "cache": self.cache, "use_cache": True}
        if self.layout.attends:
            call["position_ids"] = positions
        return call

    def _recurrent_forward(
        self,
        input_ids: torch.Tensor | None,
        new_valid: torch.Tensor | None,
        new_positions: torch.Tensor,
        structure: torch.Tensor,
        logits_to_keep: int,
        output_hidden_states: bool | int | list[int],
        recent: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> CausalLMOutputWithPast:
        """`forward` after the prompts for a model with recurrent layers: every row's real tokens fed first (their
        padding after, see `valid_first`), the state after each token recorded, the outputs in the caller's order."""
        assert self.recurrent is not None
        width = new_positions.shape[1]
        if self.capacity is not None:
            self._make_room(width)
        order = None
        if new_valid is not None:
            order = valid_first(new_valid)  # (B, q)
            new_valid, new_positions = new_valid.gather(1, order), new_positions.gather(1, order)
            if input_ids is not None:
                input_ids = input_ids.gather(1, order)
            if inputs_embeds is not None:
                inputs_embeds = inputs_embeds.gather(1, order[..., None].expand(-1, -1, inputs_embeds.shape[-1]))
            structure = _reorder_structure(structure, order)
            if recent is not None:
                recent = recent.gather(1, order[..., None].expand(-1, -1, recent.shape[-1]))
        mask = self._mask(new_valid, new_positions, structure, recent)
        # Rows reordered keep their last real token elsewhere than in the last column: all logits, then the last.
        keep = 0 if order is not None else logits_to_keep
        extra = {"logits_to_keep": keep} if self.takes_logits_to_keep else {}
        inputs = {"input_ids": input_ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        self.recurrent.record(width)
        outputs = self.model(
            **inputs, **self._call_arguments(mask, new_positions), output_hidden_states=output_hidden_states, **extra
        )
        self.recurrent.fed(new_valid, width)
        if order is not None:
            outputs = _restore_order(outputs, order, logits_to_keep)
        if new_valid is None:
            new_valid = _all_true(new_positions.shape, new_positions.device)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        if self._windowed:
            self.positions = torch.cat([self.positions, new_positions], dim=1)
        return outputs

    def start_from(
        self, layers: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Start an empty dynamic cache from keys and values computed elsewhere, one `(batch, heads, slots,
        head_dim)` pair per layer, with the slots' validity and logical positions `(batch, slots)`."""
        if self.num_slots or self.capacity is not None or self.recurrent is not None:
            raise ValueError("Only an empty dynamic cache of attention layers starts from states computed elsewhere.")
        for index, (keys, values) in enumerate(layers):
            self.cache.update(keys, values, index)
        self.valid = valid.bool()
        if self._windowed:
            self.positions = positions

    def _make_room(self, width: int) -> None:
        """Make a static cache hold `width` more slots: compact it if holes are in the way, grow it otherwise."""
        assert self.capacity is not None
        if self.num_slots + width <= self.capacity:
            return
        if self.num_slots:
            self.compact()  # reads how many slots the fullest row needs: rare (holes filled a whole headroom)
        if self.num_slots + width <= self.capacity:
            return
        self.capacity = max(2 * self.capacity, self.num_slots + width)
        self.cache.layer_class_to_replicate = functools.partial(StaticLayer, max_cache_len=self.capacity)
        for layer in self.cache.layers:
            if isinstance(layer, StaticLayer):
                _grow_static_layer(layer, self.capacity)

    def _first_forward(
        self, inputs: dict, call: dict, output_hidden_states: bool | int | list[int], extra: dict, width: int
    ) -> CausalLMOutputWithPast:
        """The first forward (the prompts): a model that cannot take a custom 4D mask, or that keeps no KV cache,
        fails here, before any token is decoded, and is refused as such."""
        name = type(self.model).__name__
        try:
            outputs = self.model(**inputs, **call, output_hidden_states=output_hidden_states, **extra)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, IndexError, TypeError) as error:
            if _own_forward_fails(self.model, inputs):
                raise ValueError(
                    f"{name}'s own forward fails on these inputs, without anything speculative decoding passes "
                    f"({type(error).__name__}: {error}): plain `generate()` fails on them too. Check the model's "
                    "config and weights."
                ) from error
            raise ValueError(
                f"{name} cannot run a forward with the custom 4D attention mask, positions and cache that speculative "
                f"decoding passes ({type(error).__name__}: {error}). Decode this model with plain `generate()`."
            ) from error
        if self.cache.get_seq_length() != width:
            raise ValueError(
                f"{name} keeps no KV cache (plain `generate()` recomputes the whole text at every step), and "
                "speculative decoding verifies drafts against a cache. Decode this model with plain `generate()`."
            )
        return outputs

    def keep_prefix(
        self, num_new: int, num_keep: torch.Tensor, keep_max: int | None = None, real_kept: list[int] | None = None
    ) -> None:
        """Keep, for each row, the first `num_keep[b]` of the last `num_new` slots and drop the rest.

        Slots no row keeps are cropped from the cache; the others become holes in the rows that dropped them.

        Args:
            num_new (`int`): how many slots the last forward(s) appended and are now being decided.
            num_keep (`torch.LongTensor` of shape `(batch,)`): how many of them each row keeps, in `[0, num_new]`.
            keep_max (`int`, *optional*): `num_keep.max()`, when the caller has it already.
            real_kept (`list[int]`, *optional*): `num_keep` on the host, when the caller knows every kept slot holds a
                real token (a verified path): recurrent states are then copied row by row, not gathered.
        """
        if keep_max is None:
            keep_max = int(num_keep.max()) if num_keep.numel() else 0
        if self.recurrent is not None:
            self.recurrent.keep(num_keep, num_new, real_kept)
        drop = num_new - keep_max
        if drop > 0:
            self._drop_last(drop)
        start = self.num_slots - keep_max
        self.valid[:, start:].logical_and_(_row_of_offsets(keep_max, self.valid.device) < num_keep[:, None])

    def keep_before(self, limit: torch.Tensor) -> None:
        """Keep, for each row, its slots at logical positions below `limit[b]` and drop the later ones (a draft
        whose own tokenization of the text changed rolls back to the tokens it still shares).

        For a sequence whose row b was fed the tokens of positions 0, 1, 2, ... in order (holes aside): the row
        then keeps its first `limit[b]` tokens. The dropped slots become holes; slots no row keeps any more are
        cropped from the end of the cache.

        Args:
            limit (`torch.LongTensor` of shape `(batch,)`): the first logical position each row drops.
        """
        if self.num_slots == 0:
            return
        if self.recurrent is not None:
            raise ValueError(
                f"{type(self.model).__name__} keeps recurrent states, which cannot go back to an earlier token of the "
                "text once a step is decided: it cannot draft through another tokenizer. Draft with a model of the "
                "target's tokenizer, or with prompt lookup."
            )
        limit = limit.to(self.valid.device)[:, None]
        if self._windowed:  # slots that left the window are holes already: read the positions
            self.valid &= self.positions < limit
        else:  # real slots in order from position 0: a slot's position is the number of real slots before it
            self.valid &= self.valid.long().cumsum(dim=1) <= limit
        kept = self.valid.any(dim=0).nonzero()  # (k, 1) slots some row keeps
        drop = self.num_slots - (int(kept.max()) + 1 if kept.numel() else 0)
        if drop > 0:
            self._drop_last(drop)

    def _drop_last(self, drop: int) -> None:
        """Crop the last `drop` slots from the cache and the bookkeeping."""
        if self.recurrent is None:
            self.cache.crop(-drop)  # transformers >= 5: a negative count of tokens to remove
        else:  # the attention slots alone: recurrent states are taken back row by row (`RecurrentStates.keep`)
            _crop_attention(self.cache, drop)
            self.recurrent.drop(drop)
        self.valid = self.valid[:, :-drop]
        if self._windowed:
            self.positions = self.positions[:, :-drop]

    def keep_path(
        self,
        num_new: int,
        nodes: torch.Tensor,
        num_keep: torch.Tensor,
        is_prefix: bool = False,
        keep_max: int | None = None,
        real_kept: list[int] | None = None,
    ) -> None:
        """Keep, for each row, the slots of an accepted tree path, in path order, and drop the other nodes.

        The kept slots are moved in place to the front of the last `num_new` (nothing moves when the caller
        knows every row's path is a prefix of the nodes, as for a chain), then the rest is dropped as by
        [`keep_prefix`].

        Args:
            num_new (`int`): how many slots the last forward appended (the tree's nodes, root first).
            nodes (`torch.LongTensor` of shape `(batch, width)`): per row, the node indices (into the last
                `num_new` slots) to keep, in order; entries past `num_keep[b]` are ignored.
            num_keep (`torch.LongTensor` of shape `(batch,)`): how many of `nodes` each row keeps.
            is_prefix (`bool`): the caller knows every row keeps a prefix of the new slots (a chain).
            keep_max (`int`, *optional*): `num_keep.max()`, when the caller has it already.
            real_kept (`list[int]`, *optional*): `num_keep` on the host (see `keep_prefix`).
        """
        if keep_max is None:
            keep_max = int(num_keep.max()) if num_keep.numel() else 0
        if not is_prefix and self.recurrent is not None:
            raise ValueError(RECURRENT_TREES.format(name=type(self.model).__name__))
        if not is_prefix:
            offsets = _row_of_offsets(keep_max, nodes.device)  # (1, keep_max)
            nodes = torch.where(offsets < num_keep[:, None], nodes[:, :keep_max], offsets)
            start = self.num_slots - num_new
            for layer in self.cache.layers:
                if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                    continue
                layer.keys[:, :, start : start + keep_max] = _gather_slots(layer.keys[:, :, start:], nodes)
                layer.values[:, :, start : start + keep_max] = _gather_slots(layer.values[:, :, start:], nodes)
            self.valid[:, start : start + keep_max] = self.valid[:, start:].gather(1, nodes)
            if self._windowed:
                self.positions[:, start : start + keep_max] = self.positions[:, start:].gather(1, nodes)
        self.keep_prefix(num_new, num_keep, keep_max, real_kept)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows of the batch (finished rows leave the batch and cost nothing more)."""
        if self.recurrent is not None:
            _select_attention_rows(self.cache, rows, static=self.capacity is not None)
            self.recurrent.select_rows(rows)
        elif self.capacity is None:
            self.cache.batch_select_indices(rows)
        else:
            for layer in self.cache.layers:
                if getattr(layer, "keys", None) is not None:
                    _set_static_states(layer, layer.keys[rows], layer.values[rows])
        self.valid = self.valid[rows]
        if self._windowed:
            self.positions = self.positions[rows]

    def fork(self, copies: int) -> None:
        """Repeat every row `copies` times, in place (row b becomes rows `b * copies` to `b * copies + copies - 1`):
        a tree's paths verified as rows of their own on a model with recurrent layers (`generation.branches`)."""
        rows = torch.arange(self.valid.shape[0], device=self.valid.device).repeat_interleave(copies)
        self.select_rows(rows)

    def join(self, rows: torch.Tensor) -> None:
        """After `fork` and a forward: keep one of each row's copies, `rows` `(batch,)` (with what it recorded)."""
        self.select_rows(rows)

    def maybe_compact(self) -> None:
        """Compact once holes make up a quarter of the slots (and at least `MIN_WASTE` slots): attention pays
        for every slot, a hole or not, while a compaction costs one copy of the cache.

        Call it between steps, once the slots of every row's committed tokens are all that is kept: with
        sliding-window attention on every layer, the slots that have left the window of their row become holes
        first (see `forget_out_of_window`), so that the cache stays within the window."""
        self.forget_out_of_window()
        if self.reads is None:
            self._waste = self.num_slots - int(self.valid.sum(dim=1).max()) if self.num_slots else 0
            self._slots_measured = self.num_slots
        if self._waste >= MIN_WASTE and self._waste >= COMPACT_FRACTION * self._slots_measured:
            self.compact(self.num_slots - self._waste)
        if self.reads is not None and self.num_slots:
            # Holes are never filled and only compaction removes them, so a row's holes a step from now are at
            # least what they are now: the value read with the loop's next read stays a safe lower bound.
            holes = self.num_slots - self.valid.sum(dim=1).max()
            self.reads.later(holes, functools.partial(self._learn_waste, self._compactions, self.num_slots))

    def _learn_waste(self, compactions: int, slots: int, holes: list[int]) -> None:
        if compactions == self._compactions:
            self._waste, self._slots_measured = holes[0], slots

    def forget_out_of_window(self) -> None:
        """With sliding-window attention on every layer, make holes of the slots no later token of their row
        can see, so that compaction can drop them.

        A key at logical position p is visible to a query at position t while `t - p < window`, and a row's
        later tokens come after its cached ones (t > the row's last cached position), so a slot at
        `p <= last + 1 - window` is never seen again. Models that mix in full-attention layers keep every slot:
        those layers see all of them, and all layers share one slot layout.
        """
        window = self.layout.sliding_window
        if window is None or self.layout.mixed or self.num_slots == 0:
            return
        last = torch.where(self.valid, self.positions, -1).max(dim=1).values  # (B,) -1 for a row with no slot
        self.valid &= self.positions > (last + 1 - window)[:, None]

    def compact(self, width: int | None = None) -> None:
        """Squeeze holes out of the cache: move every row's valid slots to the right end, in order.

        One gather per layer; afterwards the padding of every row sits on the left, as in a fresh batch.

        Args:
            width (`int`, *optional*): slots to keep, at least any row's number of valid slots (every one of
                them is kept); by default exactly the most any row has.
        """
        if width is None:
            width = int(self.valid.sum(dim=1).max())
        self._waste, self._compactions = 0, self._compactions + 1
        # Stable order: invalid slots first, then valid ones in their original order.
        order = torch.argsort(self.valid.to(torch.int8), dim=1, stable=True)[:, -width:]  # (B, width)
        slots = self.num_slots
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            if self.capacity is None:
                layer.keys = _gather_slots(layer.keys, order)
                layer.values = _gather_slots(layer.values, order)
            else:  # in place: a static cache keeps its tensors (a compiled forward holds their addresses)
                layer.keys[:, :, :width] = _gather_slots(layer.keys[:, :, :slots], order)
                layer.values[:, :, :width] = _gather_slots(layer.values[:, :, :slots], order)
                layer.cumulative_length.fill_(width)
        if self.recurrent is not None:
            self.recurrent.drop(slots - width)
        self.valid = self.valid.gather(1, order)
        if self._windowed:
            self.positions = self.positions.gather(1, order)


# Why a tree's nodes cannot be kept in place in the cache of a model with recurrent layers.
RECURRENT_TREES = (
    "{name} keeps recurrent states (linear attention, state space or convolution layers), which read the tokens of "
    "a forward in order: a tree's siblings fed side by side in one row cannot be kept. Its trees are fed path by "
    "path (a target verifying them, `generation.branches`) or node by node as rows (a draft growing them, "
    "`drafters.recurrent_tree`)."
)


def _crop_attention(cache: Cache, drop: int) -> None:
    """Crop the last `drop` slots of every attention layer of a cache that also holds recurrent layers."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None:
            continue
        if isinstance(layer, StaticLayer):
            StaticLayer.crop(layer, -drop)
        else:
            DynamicLayer.crop(layer, -drop)


def _select_attention_rows(cache: Cache, rows: torch.Tensor, static: bool) -> None:
    """Keep the given rows of every attention layer of a cache that also holds recurrent layers."""
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            continue
        if static:
            _set_static_states(layer, layer.keys[rows], layer.values[rows])
        else:
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]


def _gather_slots(states: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Gather `(batch, heads, slots, dim)` states along the slot axis with a `(batch, width)` index."""
    batch, heads, _, dim = states.shape
    index = order[:, None, :, None].expand(batch, heads, order.shape[1], dim)
    return states.gather(2, index)


def _static_cache(capacity: int) -> Cache:
    """A cache of `StaticLayer`s of `capacity` slots, one per layer as the model first writes it.

    Every layer keeps every slot, sliding-window ones included: the window is applied by the mask on logical
    positions, as with the dynamic cache."""
    return Cache(layer_class_to_replicate=functools.partial(StaticLayer, max_cache_len=capacity))


def _set_static_states(layer: StaticLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Give a static layer new key and value tensors (another batch or capacity), at a fixed address again."""
    layer.keys, layer.values = keys.contiguous(), values.contiguous()
    layer.batch_size = keys.shape[0]
    layer.max_cache_len = keys.shape[2]
    torch._dynamo.mark_static_address(layer.keys)
    torch._dynamo.mark_static_address(layer.values)


def _grow_static_layer(layer: StaticLayer, capacity: int) -> None:
    """Reallocate a static layer with `capacity` slots, keeping the slots written so far."""
    if getattr(layer, "keys", None) is None:
        layer.max_cache_len = capacity
        return
    keys, values = layer.keys, layer.values
    extra = capacity - keys.shape[2]
    _set_static_states(
        layer,
        torch.cat([keys, keys.new_zeros(*keys.shape[:2], extra, keys.shape[3])], dim=2),
        torch.cat([values, values.new_zeros(*values.shape[:2], extra, values.shape[3])], dim=2),
    )


def _pad_new_tokens(
    pad: int,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    new_valid: torch.Tensor,
    new_positions: torch.Tensor,
    structure: torch.Tensor,
    recent: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Append `pad` padding tokens to a forward's inputs: invalid, seen by no other token, each seeing only
    itself (so that attention stays finite), at the position of the last real token."""
    pad_cols = (0, pad)
    if input_ids is not None:
        input_ids = torch.nn.functional.pad(input_ids, pad_cols)
    if inputs_embeds is not None:
        inputs_embeds = torch.nn.functional.pad(inputs_embeds, (0, 0, *pad_cols))
    new_valid = torch.nn.functional.pad(new_valid, pad_cols, value=False)
    new_positions = torch.cat([new_positions, new_positions[:, -1:].expand(-1, pad)], dim=1)
    structure = torch.nn.functional.pad(structure, (0, pad, 0, pad), value=False)
    if recent is not None:
        recent = torch.nn.functional.pad(recent, (0, 0, 0, pad), value=False)
    return input_ids, inputs_embeds, new_valid, new_positions, structure, recent


def _own_outputs(outputs: CausalLMOutputWithPast, width: int, pad: int) -> CausalLMOutputWithPast:
    """A compiled forward's outputs for its `width` real tokens without the `pad` after them, copied out of
    memory the next call may reuse (CUDA graphs write every call's outputs to the same buffers)."""
    outputs.logits = outputs.logits[:, : outputs.logits.shape[1] - pad].clone()
    if outputs.hidden_states is not None:
        outputs.hidden_states = tuple(None if h is None else h[:, :width].clone() for h in outputs.hidden_states)
    return outputs


def _own_forward_fails(model: PreTrainedModel, inputs: dict) -> bool:
    """Whether `model`'s forward fails on `inputs` alone (no mask, positions or cache of ours): then the model, not
    what speculative decoding passes, is what fails."""
    try:
        model(**inputs)
    except (RuntimeError, IndexError, TypeError, ValueError):
        return True
    return False


def _reorder_structure(structure: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """An ancestor matrix `(q, q)` or `(B, q, q)` with every row's new tokens put in `order` `(B, q)`."""
    batch, q = order.shape
    structure = structure.expand(batch, q, q)
    structure = structure.gather(1, order[:, :, None].expand(batch, q, q))
    return structure.gather(2, order[:, None, :].expand(batch, q, q))


def _restore_order(outputs: ModelOutput, order: torch.Tensor, logits_to_keep: int) -> ModelOutput:
    """Outputs of a forward whose tokens were fed in `order` `(B, q)`, put back in the caller's order (the last
    `logits_to_keep` positions' logits alone when it is set)."""
    inverse = torch.argsort(order, dim=1)  # (B, q)

    def restore(states: torch.Tensor) -> torch.Tensor:
        return states.gather(1, inverse[..., None].expand(-1, -1, states.shape[-1]))

    if getattr(outputs, "logits", None) is not None:
        logits = restore(outputs.logits)
        outputs.logits = logits[:, logits.shape[1] - logits_to_keep :] if logits_to_keep else logits
    if getattr(outputs, "last_hidden_state", None) is not None:  # a decoder run alone
        outputs.last_hidden_state = restore(outputs.last_hidden_state)
    if outputs.hidden_states is not None:
        outputs.hidden_states = tuple(None if h is None else restore(h) for h in outputs.hidden_states)
    return outputs


@functools.lru_cache(maxsize=64)
def _all_true(shape: torch.Size, device: torch.device) -> torch.Tensor:
    """A shared all-True `(batch, q)` validity (never written to)."""
    return torch.ones(shape, dtype=torch.bool, device=device)


@functools.lru_cache(maxsize=256)
def _row_of_offsets(n: int, device: torch.device) -> torch.Tensor:
    """A shared `(1, n)` row 0, 1, ..., n - 1 (never written to)."""
    return torch.arange(n, device=device)[None, :]
