"""The target's verification cost curve: forward time for n new tokens per row after a cached prefix, through the
decoding loop's own cache (`CachedSequence`), eager or compiled."""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.bench.runner import compile_config_for
from hf_specdec.generation.kv_cache import STATIC_HEADROOM, CachedSequence, bucket
from hf_specdec.trees.masks import chain_structure


@torch.no_grad()
def verify_cost_curve(
    model: PreTrainedModel,
    prefix_length: int = 300,
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    repeats: int = 3,
    batch_size: int = 1,
) -> dict[int, float]:
    """Median seconds of one forward over `n` new tokens per row after a `prefix_length`-token cache, for every
    `n` in `sizes`, at `batch_size` rows (`time_forwards`, eager).

    Returns:
        `{n: seconds}` for every n in `sizes`.
    """
    return time_forwards(model, sizes, False, math.inf, prefix=prefix_length, repeats=repeats, rows=batch_size)


@torch.no_grad()
def time_forwards(
    model: PreTrainedModel,
    widths: tuple[int, ...],
    compiled: bool,
    deadline: float,
    prefix: int = 256,
    repeats: int = 5,
    rows: int = 1,
) -> dict[int, float]:
    """Median seconds of one forward over `n` new tokens per row (a chain) after a `prefix`-token cache, at `rows`
    rows, for each `n` in `widths` measured before `deadline` (`time.perf_counter()`), through `CachedSequence` as
    the decoding loop runs it; compiled: a static cache and the compiled forward (the first call per width, which
    compiles, is not timed)."""
    device = model.device
    if compiled and any(bucket(n) != n for n in widths):
        raise ValueError(f"Compiled widths are fed bucketed (1, 2, 3, 4, 6, 8, 12, ...): {widths} are not all buckets.")
    capacity = prefix + max(widths) + STATIC_HEADROOM if compiled else None
    seq = CachedSequence(model, rows, device, capacity=capacity)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(0, vocab, (rows, prefix), generator=generator).to(device)
    positions = torch.arange(prefix, device=device).expand(rows, -1)
    seq.forward(
        ids, torch.ones_like(ids, dtype=torch.bool), positions, chain_structure(prefix, device), logits_to_keep=1
    )
    if compiled:
        seq.compile(GenerationConfig(compile_config=compile_config_for(device)))
    times: dict[int, float] = {}
    for n in widths:
        if time.perf_counter() > deadline:
            break
        nodes = torch.randint(0, vocab, (rows, n), generator=generator).to(device)
        args = (
            nodes,
            torch.ones_like(nodes, dtype=torch.bool),
            prefix + torch.arange(n, device=device).expand(rows, -1),
        )
        step = functools.partial(seq.forward, *args, chain_structure(n, device))
        times[n] = median_seconds(step, seq, n, repeats, device)
    return times


def median_seconds(
    step: Callable[[], object], seq: CachedSequence, width: int, repeats: int, device: torch.device
) -> float:
    """Median seconds of `step` (which appends `width` entries to `seq`'s cache, dropped after each call) over
    `repeats` calls, after one untimed call (warm-up, and compilation)."""
    samples = []
    for repeat in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        if repeat:
            samples.append(time.perf_counter() - start)
        seq.keep_prefix(width, torch.zeros(seq.valid.shape[0], dtype=torch.long, device=device), keep_max=0)
    return statistics.median(samples)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA), so that a wall-clock reading includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
