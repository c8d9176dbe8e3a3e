"""A missing optional dependency is named with the extra that installs it, before any work starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hf_specdec import zoo


def test_training_without_datasets_names_the_train_extra() -> None:
    code = "import sys; sys.modules['datasets'] = None; import hf_specdec.training"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "ImportError: hf_specdec.training needs datasets" in result.stderr
    assert 'pip install "hf_specdec[train]"' in result.stderr


def test_a_zoo_model_to_convert_without_gguf_names_the_models_extra_before_downloading(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zoo, "cache_dir", lambda: tmp_path)
    real_find_spec = zoo.importlib.util.find_spec
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))

    def no_download(*args, **kwargs):
        raise AssertionError("fetched before checking gguf")

    monkeypatch.setattr(zoo, "fetch_gguf", no_download)
    with pytest.raises(ImportError, match=r'pip install "hf_specdec\[models\]"'):
        zoo.model_path("smollm2-135m")
