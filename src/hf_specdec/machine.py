"""What the machine can run fast: bf16 matrix products need a GPU, or a CPU with AVX512-BF16 or AMX; on a CPU with
AVX2 alone torch computes them several times slower than float32 ones (a 1000x1536 by 1536x1536 product: 0.8
against 177 GFLOP/s on a 2-core AMD EPYC), so models run there in float32, and timings there are taken in float32.
"""

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


def cpu_has_fast_bf16() -> bool | None:
    """Whether the CPU computes bf16 matrix products fast (it has one of `FAST_BF16_FLAGS`); `None` where its flags
    cannot be read."""
    flags = cpu_flags()
    return None if flags is None else bool(flags & FAST_BF16_FLAGS)


def fast_dtype(device: str) -> torch.dtype:
    """The dtype models decode fastest in on `device` ("cpu", "cuda", "cuda:1", "mps") without float16's narrow
    range: bfloat16 on a CUDA GPU that computes it (float16 on one that does not) and on a CPU with AVX512-BF16 or
    AMX; float32 on other CPUs (AVX2 alone, or flags that cannot be read) and other devices."""
    if device.startswith("cuda"):
        major, _ = torch.cuda.get_device_capability(torch.device(device))
        return torch.bfloat16 if major >= 8 else torch.float16  # bf16 in hardware from Ampere on
    return torch.bfloat16 if device.startswith("cpu") and cpu_has_fast_bf16() else torch.float32


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux's MemAvailable); `None` where /proc/meminfo cannot be read."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as lines:
        for line in lines:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def cpu_case() -> str:
    """One line: the CPU, and which of the two cases the library's CPU figures come in it is (bfloat16 fast, with
    AVX512-BF16 or AMX; or float32 with packed linear layers, with AVX2 alone), as `--dtype auto` decides."""
    name = cpuinfo("model name") or "a CPU whose model /proc/cpuinfo does not give"
    fast = cpu_has_fast_bf16()
    if fast is None:
        return f"cpu: {name}, its instruction set unknown here: --dtype auto picks float32"
    if fast:
        found = sorted(FAST_BF16_FLAGS & (cpu_flags() or frozenset()))
        return f"cpu: {name}, with {' and '.join(found)}: bfloat16 runs fast here, and --dtype auto picks it"
    return (
        f"cpu: {name}, without AVX512-BF16 or AMX: bfloat16 is slow here, so --dtype auto picks float32 (the demo "
        "packs its linear layers, `hf_specdec.pack_linears`)"
    )


def slow_bf16_warning(device: str, dtype: torch.dtype) -> str | None:
    """A warning for bf16 models on a CPU that has none of `FAST_BF16_FLAGS` (`None` elsewhere, and where the flags
    cannot be read)."""
    if dtype != torch.bfloat16 or not device.startswith("cpu") or cpu_has_fast_bf16() is not False:
        return None
    return (
        "This CPU has no AVX512-BF16 or AMX instructions: bfloat16 models run several times slower here than in "
        "float32, and timings in bfloat16 do not compare with those of CPUs that have them. Pass --dtype float32 "
        "(or --dtype auto, which picks it here)."
    )
