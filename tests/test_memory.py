"""Memory stays flat: long generations on every decoding path keep each KV cache within what the sequence
needs, and nothing accumulates from one `generate()` call to the next.

(a) Every `CachedSequence.forward` (target and draft) is watched while batches of a few thousand tokens are
generated. Say a sequence's last compaction check (`maybe_compact`, or the prefill) left its longest row with
`V` real tokens in the cache, and `q` slots were fed since (this step's verified tokens, or the draft's
pending and drafted tokens). The compaction rule leaves fewer holes than `MIN_WASTE` or than
`COMPACT_FRACTION` of the slots; with `slots = V + holes` the latter reads `holes < V * F / (1 - F)` (F = 1/4:
`V / 3`). A check learns how many holes there are with the loop's one read of the step, so a cache over the
threshold at one check (rows that left the batch, holes that piled up) is compacted at the next one. So after
every forward

    slots <= V + q + max(allowance(V), H),   allowance(V) = max(MIN_WASTE - 1, ceil(V * F / (1 - F)) - 1),

where `H` is the holes the last check found.

and the DynamicCache of every layer holds exactly `slots` entries. `V` is cross-checked against the committed
tokens: for every row still running, the target's cache holds its real committed tokens but the last one
(`V = N - 1` for the longest row's `N` committed tokens without padding), the draft's all but the one or two
it has pending. Rows that leave the batch keep their slots until the next check, so `V` is over the rows at
the last check.

A sliding-window model ("mistral", window w = 16 over generations of 1,000 tokens) keeps full-attention
layers and applies the window in the mask, on logical positions; slots that have left the window of their
row are holes that compaction drops, so there a row holds at most `w - 1` real tokens after a check (`V =
min(N - 1, w - 1)`) and the cache never exceeds `w - 1 + 2Q + MIN_WASTE - 1` slots, however long the sequence.
Every generation is also checked against plain greedy decoding.

(b) Between the 2nd and later `generate()` calls the number of live tensors and of gc-tracked objects, the
bytes of live tensor storage, the models' attributes, hooks, buffers and containers, and the Python heap
(tracemalloc) do not grow, and no cache, token buffer or drafter of a finished call survives it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import hashlib
import math
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from fractions import Fraction
from typing import Any, NamedTuple
from unittest import mock

import pytest
import torch
from torch import nn
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
)

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM
from hf_specdec.drafters.draft_model import DraftModelDrafter
from hf_specdec.drafters.hybrid import HybridDrafter
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.generation.kv_cache import COMPACT_FRACTION, MIN_WASTE, CachedSequence
from hf_specdec.generation.sequences import TokenBuffer
from tests.tiny_models import BOS, PAD, VOCAB

NEW_TOKENS = 1000  # per row, 3 rows: 3,000 generated tokens per path
WINDOW = 16  # the sliding window of the "mistral" models, far shorter than the generations
LOOKUP = 6
NEW_TOKENS_PER_CALL = 32  # (b): short calls, several of them

# name -> (kind, generate() keyword arguments); "draft" paths get `assistant=` added, "medusa" ones run on
# MedusaForCausalLM with `medusa=True`.
COSTS = hf_specdec.SpeculativeCosts(draft_forward=0.3, verify_per_token=0.02)
PATHS: dict[str, tuple[str, dict[str, Any]]] = {
    "draft": ("draft", {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant"}),
    "lookup": ("lookup", {"prompt_lookup_num_tokens": LOOKUP}),
    "hybrid": ("draft", {"prompt_lookup_num_tokens": LOOKUP, "num_assistant_tokens": 5}),
    "static": ("medusa", {"tree": "small"}),
    "dynamic": ("medusa", {"tree": DynamicTree(num_nodes=6, top_k=3)}),
    "tree+lookup": ("medusa", {"prompt_lookup_num_tokens": LOOKUP}),
}
CASES = [
    pytest.param(path, head_type, id=f"{path}-{head_type}" if head_type else path)
    for path, (kind, _) in PATHS.items()
    for head_type in (("medusa", "recurrent") if kind == "medusa" else (None,))
]


def _model(arch: str, seed: int) -> PreTrainedModel:
    """A 1-layer random model with room for a few thousand positions; EOS unset, so every row runs to
    `max_new_tokens` (plain semantics: no EOS, no early stop)."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=None,
        pad_token_id=PAD,
        bos_token_id=BOS,
    )
    torch.manual_seed(seed)
    if arch == "mistral":
        model = MistralForCausalLM(MistralConfig(sliding_window=WINDOW, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():  # peakier distributions: generations that repeat, drafts that are sometimes right
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()


@dataclasses.dataclass
class Models:
    arch: str
    target: PreTrainedModel
    draft: PreTrainedModel
    medusa: dict[str, MedusaForCausalLM]


@functools.cache
def _models(arch: str) -> Models:
    target = hf_specdec.speculative(_model(arch, seed=0))
    # The target with noise: accepts part of its drafts, a different number per row.
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.3 * parameter.std() * torch.randn(parameter.shape, generator=generator))
    medusa = {
        head_type: MedusaForCausalLM.from_base(_model(arch, seed=0), MedusaConfig(3, head_type=head_type))
        for head_type in ("medusa", "recurrent")
    }
    return Models(arch, target, draft, medusa)


@functools.cache
def _plain(arch: str) -> torch.Tensor:
    """Plain greedy decoding of the long generations (the Medusa bases are the target's twins)."""
    ids, mask = _prompts()
    return _models(arch).target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)


def _prompts(batch: int = 3, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts; row 0 has no padding (so the prefill leaves no holes), the others 4 and 8."""
    ids = torch.randint(4, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    for b in range(batch):
        mask[b, : 4 * b] = 0
    ids[mask == 0] = PAD
    return ids, mask


def _generate(models: Models, path: str, head_type: str | None, max_new_tokens: int) -> torch.Tensor:
    kind, kwargs = PATHS[path]
    ids, mask = _prompts()
    # Fixed costs: the same drafts and widths at every round, whatever the machine's load (measured timings would
    # let a busy machine try widths, and fill shape-keyed caches, that a quiet one never reaches).
    common = dict(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, speculative_costs=COSTS
    )
    if kind == "medusa":
        assert head_type is not None
        return models.medusa[head_type].generate(**common, medusa=True, **kwargs)
    if kind == "draft":
        return models.target.generate(**common, assistant=models.draft, **kwargs)
    return models.target.generate(**common, **kwargs)


# (a) The caches stay within what the sequence needs -------------------------------------------------------


def allowance(valid: int) -> int:
    """The most holes the compaction rule leaves in a cache whose longest row holds `valid` real tokens."""
    fraction = Fraction(COMPACT_FRACTION)
    return max(MIN_WASTE - 1, math.ceil(valid * fraction / (1 - fraction)) - 1)


@dataclasses.dataclass
class Watched:
    """One CachedSequence as the watcher follows it."""

    role: str  # "target" or "draft"
    valid_at_check: int = 0  # V: real tokens of the longest row at the last compaction check
    fed_since_check: int = 0  # q: slots appended since
    checks: int = 0
    compactions: int = 0
    peak_slots: int = 0
    peak_needed: int = 0  # V + q at the forward with the most slots
    peak_holes: int = 0  # the most slots beyond V + q after any forward
    peak_fed: int = 0  # the most slots fed between two checks
    over: bool = False  # the last check found more holes than the rule leaves (compacted at the next one)
    holes_at_check: int = 0  # and how many
    compactions_at_check: int = 0
    forwards: int = 0


class Watcher:
    """Wraps CachedSequence's methods (the decoding loops are untouched) and checks the bounds as they run."""

    def __init__(self, target: PreTrainedModel, pads: torch.Tensor) -> None:
        self.target = target
        self.pads = pads  # (B,) left padding per row
        self.seqs: dict[int, Watched] = {}
        self.buffer: TokenBuffer | None = None
        self._keep: list[CachedSequence] = []  # keeps ids unique for the watcher's lifetime

    @contextmanager
    def watching(self) -> Iterator[Watcher]:
        with ExitStack() as stack:
            for cls, name, after in (
                (CachedSequence, "forward", self._after_forward),
                (CachedSequence, "maybe_compact", self._after_check),
                (CachedSequence, "compact", self._after_compact),
                (CachedSequence, "start_from", self._after_start),
                (TokenBuffer, "__init__", self._after_buffer),
            ):
                stack.enter_context(mock.patch.object(cls, name, new=_wrap(getattr(cls, name), after)))
            yield self

    def _after_buffer(self, buffer: TokenBuffer, *args: Any, **kwargs: Any) -> None:
        self.buffer = buffer

    def _watched(self, seq: CachedSequence) -> Watched:
        if id(seq) not in self.seqs:
            self._keep.append(seq)
            self.seqs[id(seq)] = Watched("target" if seq.model is self.target else "draft")
        return self.seqs[id(seq)]

    def _after_forward(self, seq: CachedSequence, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        watched = self._watched(seq)
        watched.forwards += 1
        first = watched.peak_slots == 0
        slots = seq.num_slots
        assert isinstance(seq.cache, DynamicCache)
        for layer in seq.cache.layers:  # the memory itself: every layer holds exactly one entry per slot
            assert type(layer).__name__ == "DynamicLayer"  # full layers, even for sliding-window models
            assert layer.keys.shape[2] == layer.values.shape[2] == slots
        assert seq.valid.shape == (input_ids.shape[0], slots)
        if seq.layout.sliding_window is not None:  # slot positions: kept for sliding-window masks alone
            assert seq.positions.shape == seq.valid.shape
        watched.fed_since_check += input_ids.shape[1]
        watched.peak_fed = max(watched.peak_fed, watched.fed_since_check)
        needed = watched.valid_at_check + watched.fed_since_check
        holes = slots - needed
        # A check over the threshold is followed by a compaction at the next one (it learns the holes with the
        # step's one read): until then the cache keeps the holes it had.
        limit = max(allowance(watched.valid_at_check), watched.holes_at_check)
        assert holes <= limit, (watched.role, slots, needed)
        if slots > watched.peak_slots:
            watched.peak_slots, watched.peak_needed = slots, needed
        watched.peak_holes = max(watched.peak_holes, holes)
        if first:  # the prefill: the unpadded row 0 makes it hole-free; it is the first check
            assert int(seq.valid.sum(dim=1).max()) == slots
            watched.valid_at_check, watched.fed_since_check = slots, 0

    def _after_start(self, seq: CachedSequence, *args: Any) -> None:
        """A cache assembled from a prefill by span: checked as one its own prefill forward left."""
        watched = self._watched(seq)
        slots = seq.num_slots
        assert int(seq.valid.sum(dim=1).max()) == slots  # the unpadded row 0: no holes
        watched.peak_slots = watched.peak_needed = watched.valid_at_check = slots

    def _after_compact(self, seq: CachedSequence, *args: Any) -> None:
        self._watched(seq).compactions += 1

    def _after_check(self, seq: CachedSequence) -> None:
        watched = self._watched(seq)
        slots, valid = seq.num_slots, seq.valid.sum(dim=1)  # (A,)
        longest = int(valid.max())
        holes = slots - longest
        over = holes >= MIN_WASTE and holes >= COMPACT_FRACTION * slots
        compacted = watched.compactions > watched.compactions_at_check
        # Never two checks in a row over the threshold without a compaction at the second.
        assert not (over and watched.over and not compacted), (watched.role, slots, longest)
        watched.over, watched.holes_at_check, watched.compactions_at_check = over, holes, watched.compactions
        # The bookkeeping against the committed tokens: per running row, real committed tokens less the last
        # one (target), less the one or two tokens the draft has pending.
        assert self.buffer is not None
        active = self.buffer.active
        lengths = self.buffer.lengths[active]
        committed = lengths - self.pads[active]  # (A,) real committed tokens
        running = lengths < self.buffer.max_length
        assert valid.shape == committed.shape
        window = None if seq.layout.mixed else seq.layout.sliding_window
        cap = committed.new_tensor(window - 1 if window is not None else int(committed.max()))  # a window: w - 1
        if watched.role == "target":
            assert torch.equal(valid[running], torch.minimum(committed[running] - 1, cap))
        else:
            one, two = (torch.minimum(committed[running] - lag, cap) for lag in (1, 2))
            assert bool(((valid[running] == one) | (valid[running] == two)).all())
        watched.valid_at_check, watched.fed_since_check = longest, 0
        watched.checks += 1


def _wrap(method: Callable[..., Any], after: Callable[..., None]) -> Callable[..., Any]:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        after(self, *args, **kwargs)
        return result

    return wrapped


@pytest.mark.parametrize(("path", "head_type"), CASES)
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_caches_never_grow_past_what_the_sequence_needs(arch: str, path: str, head_type: str | None) -> None:
    models = _models(arch)
    target = models.medusa[head_type].base if head_type else models.target
    _, mask = _prompts()
    watcher = Watcher(target, pads=(mask == 0).sum(dim=1))
    with watcher.watching():
        out = _generate(models, path, head_type, NEW_TOKENS)
    assert torch.equal(out, _plain(arch))  # every token of every row (no EOS), as plain greedy decoding
    # A draft's prefill by span runs each group of rows in a cache of its own, one forward, then dropped.
    decoding = [w for w in watcher.seqs.values() if w.checks or w.forwards > 1]
    parts = [w for w in watcher.seqs.values() if not (w.checks or w.forwards > 1)]
    assert all(w.role == "draft" and w.forwards == 1 for w in parts)
    roles = sorted(w.role for w in decoding)
    assert roles == (["draft", "target"] if PATHS[path][0] == "draft" else ["target"])
    for watched in decoding:
        assert watched.checks > 0
        if arch == "mistral":  # the window, not the sequence, bounds the cache
            assert watched.peak_slots <= WINDOW - 1 + 2 * watched.peak_fed + MIN_WASTE - 1
        print(
            f"{path} {head_type or ''} {watched.role}: peak {watched.peak_slots} slots for {watched.peak_needed} "
            f"needed (allowance {allowance(watched.peak_needed)}), at most {watched.peak_holes} holes, "
            f"{watched.compactions} compactions in {watched.checks} steps"
        )


# (b) Nothing accumulates between calls ------------------------------------------------------------------

# Objects that live for one call; none may survive it.
PER_CALL = (CachedSequence, TokenBuffer, DynamicCache, DraftModelDrafter, PromptLookupDrafter, HybridDrafter)


def _module_state(module: nn.Module) -> list[tuple[Any, ...]]:
    """Per submodule: its attributes, hooks, parameters, buffers, and the sizes of container attributes."""
    state = []
    for name, sub in module.named_modules():
        attributes = vars(sub)
        sizes = tuple(
            (key, len(value)) for key, value in sorted(attributes.items()) if isinstance(value, (list, dict, set))
        )
        state.append((name, type(sub).__name__, tuple(sorted(attributes)), sizes))
    return state


class Footprint(NamedTuple):
    """What one `generate()` call could leave behind; atomic fields only, so that keeping one adds no object
    that the next count sees (the garbage collector untracks tuples of atoms)."""

    objects: int  # gc-tracked objects
    tensors: int  # live tensors
    storage_bytes: int  # bytes of their storages
    leftovers: str  # per-call objects still alive
    models: str  # digest of the models' attributes, hooks, buffers, containers and configs


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    """A tensor's storage as (address, bytes); `None` for the fake tensors `torch.compile` keeps for the graphs it
    compiled (earlier tests compile), which hold no memory."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except RuntimeError:
        return None


def _footprint(models: Models) -> Footprint:
    gc.collect()
    objects = [o for o in gc.get_objects() if type(o) is not Footprint]  # not the footprints being compared
    tensors = [o for o in objects if issubclass(type(o), torch.Tensor)]
    storages = dict(filter(None, (_storage(t) for t in tensors if not t.is_meta)))
    leftovers = " ".join(sorted(type(o).__name__ for o in objects if issubclass(type(o), PER_CALL)))
    roots: list[nn.Module] = [models.target, models.draft, *models.medusa.values()]
    state: list[Any] = [_module_state(m) for m in roots]
    state += [m.generation_config.to_dict() for m in (models.target, models.draft)]
    state += [(m.base.generation_config.to_dict(), vars(m.config)) for m in models.medusa.values()]
    digest = hashlib.sha256(repr(state).encode()).hexdigest()
    footprint = Footprint(len(objects), len(tensors), sum(storages.values()), leftovers, digest)
    del objects, tensors
    return footprint


def test_nothing_accumulates_between_calls() -> None:
    """Rounds of one short call per path: the footprint after the 2nd round is the most that later rounds
    may leave."""
    models = _models("llama")
    cases = [tuple(case.values) for case in CASES]

    def one_round() -> None:
        for path, head_type in cases:
            _generate(models, path, head_type, NEW_TOKENS_PER_CALL)

    tracemalloc.start()  # from the start: what the 2nd round frees counts as much as what later rounds keep
    try:
        # The measurement's own first-time work (lazy imports, resets of the ABC caches that the next call
        # refills) happens before the calls it measures.
        tracemalloc.take_snapshot()
        _footprint(models)
        for _ in range(2):  # the first round may fill transformers' and torch's one-time caches
            one_round()
        heap_before = tracemalloc.take_snapshot()
        before = _footprint(models)
        assert before.leftovers == ""
        for _ in range(2):
            one_round()
            after = _footprint(models)
            assert after.objects <= before.objects, (before, after)
            assert after.tensors <= before.tensors, (before, after)
            assert after.storage_bytes <= before.storage_bytes, (before, after)
            assert (after.leftovers, after.models) == (before.leftovers, before.models)
        del after
        heap_after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # The measurement's own allocations (the snapshots, the footprints) are not the calls'.
    own = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    stats = heap_after.filter_traces(own).compare_to(heap_before.filter_traces(own), "lineno")
    grown = sum(stat.size_diff for stat in stats)
    top = "\n".join(str(stat) for stat in sorted(stats, key=lambda stat: -stat.size_diff)[:12])
    print(
        f"Python heap {grown:+d} bytes from the 2nd round to the 4th; {before.objects} objects, {before.tensors} "
        f"tensors ({before.storage_bytes} bytes) after the 2nd round and every later one; grown most:\n{top}"
    )
    assert grown < 64 * 1024, f"{grown} bytes; where the heap grew most:\n{top}"
