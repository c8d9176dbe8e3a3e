"""What the CPU can do fast: bf16 matrix products need AVX512-BF16 or AMX; on a CPU with AVX2 alone torch computes
them several times slower than float32 ones, so timings there should be taken in float32."""

from __future__ import annotations

import contextlib
import functools

import torch

# CPU flags (Linux's /proc/cpuinfo names) under which torch's bf16 matrix products are fast.
FAST_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.cache
def cpuinfo(field: str) -> str | None:
    """The first CPU's `field` in Linux's /proc/cpuinfo (`"model name"`, `"flags"`); `None` where it cannot be read
    (other systems) or has no such field."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as lines:
        return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(field)), None)
    return None


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them (`None` where /proc/cpuinfo cannot be read: other systems)."""
    flags = cpuinfo("flags")
    return None if flags is None else frozenset(flags.split())


def slow_bf16_warning(device: str, dtype: torch.dtype) -> str | None:
    """A warning for bf16 models on a CPU that has none of `FAST_BF16_FLAGS` (`None` elsewhere, and where the flags
    cannot be read)."""
    flags = cpu_flags()
    if dtype != torch.bfloat16 or not device.startswith("cpu") or flags is None or flags & FAST_BF16_FLAGS:
        return None
    return (
        "This CPU has no AVX512-BF16 or AMX instructions: bfloat16 models run several times slower here than in "
        "float32, and timings in bfloat16 do not compare with those of CPUs that have them. Pass --dtype float32."
    )
