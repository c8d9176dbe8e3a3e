"""What runs fast where: bf16 on a CPU without bf16 instructions is warned about before a benchmark or the demo times
anything, and `--dtype auto` (the default of the commands that run models) picks float32 there."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import machine
from hf_specdec.cli import build_parser
from hf_specdec.cli_args import model_dtype
from hf_specdec.training.pipeline import MedusaTrainingConfig

AVX2 = frozenset({"fpu", "avx2", "fma"})
BF16_CPUS = (frozenset({"avx2", "avx512f", "avx512_bf16"}), frozenset({"avx2", "amx_tile", "amx_bf16"}))


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_about(monkeypatch) -> None:
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX2)
    warning = machine.slow_bf16_warning("cpu", torch.bfloat16)
    assert warning is not None and "--dtype float32" in warning
    assert machine.slow_bf16_warning("cpu", torch.float32) is None
    assert machine.slow_bf16_warning("cuda", torch.bfloat16) is None
    assert machine.slow_bf16_warning("cuda:1", torch.bfloat16) is None


def test_bf16_on_a_cpu_with_bf16_instructions_or_unknown_flags_is_not(monkeypatch) -> None:
    for flags in BF16_CPUS:
        monkeypatch.setattr(machine, "cpu_flags", lambda flags=flags: flags)
        assert machine.slow_bf16_warning("cpu", torch.bfloat16) is None
    monkeypatch.setattr(machine, "cpu_flags", lambda: None)  # not Linux: nothing to go by
    assert machine.slow_bf16_warning("cpu", torch.bfloat16) is None


def test_auto_runs_float32_on_a_cpu_without_bf16_instructions_and_bf16_on_one_with_them(monkeypatch) -> None:
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX2)
    assert model_dtype("auto", "cpu") is torch.float32
    assert machine.slow_bf16_warning("cpu", model_dtype("auto", "cpu")) is None
    for flags in BF16_CPUS:
        monkeypatch.setattr(machine, "cpu_flags", lambda flags=flags: flags)
        assert model_dtype("auto", "cpu") is torch.bfloat16
    monkeypatch.setattr(machine, "cpu_flags", lambda: None)
    assert model_dtype("auto", "cpu") is torch.float32  # flags unknown: the dtype every CPU runs well
    assert model_dtype("auto", "mps") is torch.float32
    assert model_dtype("bfloat16", "cpu") is torch.bfloat16  # a named dtype is taken as it is
    assert model_dtype("float16", "cpu") is torch.float16


@pytest.mark.parametrize(("major", "expected"), [(9, torch.bfloat16), (8, torch.bfloat16), (7, torch.float16)])
def test_auto_runs_bf16_on_gpus_that_compute_it_and_float16_on_older_ones(monkeypatch, major, expected) -> None:
    seen = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: seen.append(device) or (major, 0))
    assert model_dtype("auto", "cuda:1") is expected
    assert seen == [torch.device("cuda:1")]


def test_the_demo_and_the_benchmark_pick_the_dtype_by_default() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).dtype == "auto"
    assert parser.parse_args(["bench"]).dtype == "auto"
    assert parser.parse_args(["bench", "--dtype", "float32"]).dtype == "float32"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--dtype", "int8"])


def test_a_training_run_records_the_dtype_auto_chose(monkeypatch) -> None:
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert MedusaTrainingConfig(base="smollm2-135m", data="records.jsonl", dtype="auto").dtype == "float32"
    monkeypatch.setattr(machine, "cpu_flags", lambda: BF16_CPUS[0])
    assert MedusaTrainingConfig(base="smollm2-135m", data="records.jsonl", dtype="auto").dtype == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of"):
        MedusaTrainingConfig(base="smollm2-135m", data="records.jsonl", dtype="fp8")


def test_the_cpu_case_names_the_cpu_and_what_auto_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpuinfo", lambda field: "Some CPU" if field == "model name" else None)
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX2)
    assert machine.cpu_case().startswith("cpu: Some CPU, without AVX512-BF16 or AMX")
    assert "--dtype auto picks float32" in machine.cpu_case()
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX2 | {"amx_bf16", "avx512_bf16"})
    assert machine.cpu_case() == (
        "cpu: Some CPU, with amx_bf16 and avx512_bf16: bfloat16 runs fast here, and --dtype auto picks it"
    )
    monkeypatch.setattr(machine, "cpu_flags", lambda: None)
    assert "unknown here: --dtype auto picks float32" in machine.cpu_case()


def test_available_memory_is_read_where_linux_gives_it() -> None:
    available = machine.available_memory()
    assert available is None or available > 0
