"""bf16 on a CPU without bf16 instructions is warned about before a benchmark or the demo times anything."""

from __future__ import annotations

import torch

from hf_specdec.bench import hardware


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_about(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"fpu", "avx2", "fma"}))
    warning = hardware.slow_bf16_warning("cpu", torch.bfloat16)
    assert warning is not None and "--dtype float32" in warning
    assert hardware.slow_bf16_warning("cpu", torch.float32) is None
    assert hardware.slow_bf16_warning("cuda", torch.bfloat16) is None
    assert hardware.slow_bf16_warning("cuda:1", torch.bfloat16) is None


def test_bf16_on_a_cpu_with_bf16_instructions_or_unknown_flags_is_not(monkeypatch) -> None:
    for flags in ({"avx2", "avx512f", "avx512_bf16"}, {"avx2", "amx_tile", "amx_bf16"}):
        monkeypatch.setattr(hardware, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert hardware.slow_bf16_warning("cpu", torch.bfloat16) is None
    monkeypatch.setattr(hardware, "cpu_flags", lambda: None)  # not Linux: nothing to go by
    assert hardware.slow_bf16_warning("cpu", torch.bfloat16) is None
