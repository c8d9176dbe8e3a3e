"""The target's verification cost curve: forward time for n new tokens after a cached prefix."""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache, PreTrainedModel


@torch.no_grad()
def verify_cost_curve(
    model: PreTrainedModel,
    prefix_length: int = 300,
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    repeats: int = 3,
    batch_size: int = 1,
) -> dict[int, float]:
    """Median seconds of one forward over `n` new tokens per row after a `prefix_length`-token cache.

    Returns:
        `{n: seconds}` for every n in `sizes`.
    """
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    prefix = torch.randint(0, vocab, (batch_size, prefix_length), generator=generator).to(model.device)
    cache = DynamicCache()
    model(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
    curve: dict[int, float] = {}
    for n in sizes:
        tokens = torch.randint(0, vocab, (batch_size, n), generator=generator).to(model.device)
        times = []
        for _ in range(repeats):
            synchronize(model.device)
            start = time.perf_counter()
            model(input_ids=tokens, cache=cache, use_cache=True)
            synchronize(model.device)
            times.append(time.perf_counter() - start)
            cache.crop(-n)
        curve[n] = statistics.median(times)
    return curve


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA), so that a wall-clock reading includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
