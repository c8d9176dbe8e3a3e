"""A missing optional dependency is named with the extra that installs it, before any work starts."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hf_specdec import MedusaConfig, MedusaForCausalLM, extras, zoo
from hf_specdec.medusa.model import ADAPTER_FOLDER
from tests.recipe import recipe_main


def _uninstall(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `modules` look not installed to `importlib.util.find_spec`, which the checks ask."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name in modules else real_find_spec(name, *args)
    )


def test_require_names_the_missing_modules_and_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    extras.require("train", "datasets", "peft", purpose="Training heads")  # installed here: nothing raised
    _uninstall(monkeypatch, "datasets", "peft")
    with pytest.raises(extras.MissingExtraError) as error:
        extras.require("train", "datasets", "peft", purpose="Training heads")
    assert str(error.value) == (
        "Training heads needs datasets and peft, which are not installed: install the [train] extra with "
        'pip install -e ".[train]"'
    )
    assert isinstance(error.value, ModuleNotFoundError) and error.value.name == "datasets"
    with pytest.raises(extras.MissingExtraError, match=r'needs peft, which is not installed: .*"\.\[train\]"'):
        extras.require("train", "peft", purpose="Merging adapters")
    with pytest.raises(extras.MissingExtraError, match="needs datasets and peft"):
        extras.require("train", purpose="Training heads")  # no modules: every module of the extra


def test_require_refuses_an_extra_or_module_the_package_does_not_have() -> None:
    with pytest.raises(ValueError, match="Unknown extra 'gpu'"):
        extras.require("gpu", "torch", purpose="x")
    with pytest.raises(ValueError, match=r"The \[models\] extra does not install peft"):
        extras.require("models", "peft", purpose="x")


def test_a_module_set_to_none_in_sys_modules_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert extras.missing("matplotlib", "gguf") == ["matplotlib"]
    with pytest.raises(extras.MissingExtraError, match=r'pip install -e "\.\[plot\]"'):
        extras.require("plot", "matplotlib", purpose="Plotting")


def test_training_without_datasets_names_the_train_extra() -> None:
    code = "import sys; sys.modules['datasets'] = None; import hf_specdec.training"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "MissingExtraError: hf_specdec.training (training heads) needs datasets" in result.stderr
    assert 'pip install -e ".[train]"' in result.stderr


@pytest.mark.parametrize("missing", ["datasets", "peft"])
def test_the_training_recipe_without_the_train_extra_stops_before_loading_a_model(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = recipe_main()

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the extras were checked")

    monkeypatch.setattr("hf_specdec.training.pipeline.load_model", no_model)
    _uninstall(monkeypatch, missing)
    argv = ["--base", "smollm2-135m", "--data", str(tmp_path / "data.jsonl"), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    message = str(exit_info.value.code)
    assert message.startswith(f"train_medusa.py: error: Training heads needs {missing}, which is not installed")
    assert message.endswith('pip install -e ".[train]"') and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_the_training_recipe_with_a_zoo_base_to_convert_asks_for_gguf_before_downloading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zoo, "cache_dir", lambda: tmp_path / "cache")

    def no_download(*args, **kwargs):
        raise AssertionError("fetched before checking gguf")

    monkeypatch.setattr(zoo, "fetch_gguf", no_download)
    _uninstall(monkeypatch, "gguf")
    data = tmp_path / "data.jsonl"
    data.write_text('{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}\n')
    argv = ["--base", "smollm2-135m", "--data", str(data), "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    with pytest.raises(SystemExit) as exit_info:
        recipe_main()(argv)
    message = str(exit_info.value.code)
    assert "Converting zoo model 'smollm2-135m' on its first use needs gguf" in message
    assert message.endswith('pip install -e ".[models]"')


def test_a_zoo_model_to_convert_without_gguf_names_the_models_extra_before_downloading(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zoo, "cache_dir", lambda: tmp_path)
    _uninstall(monkeypatch, "gguf")

    def no_download(*args, **kwargs):
        raise AssertionError("fetched before checking gguf")

    monkeypatch.setattr(zoo, "fetch_gguf", no_download)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[models\]"'):
        zoo.model_path("smollm2-135m")


def test_heads_with_base_adapters_without_peft_are_refused_before_the_base_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "heads"
    MedusaConfig(num_heads=2, base_model_name_or_path="org/base").save_pretrained(folder)
    (folder / ADAPTER_FOLDER).mkdir()
    _uninstall(monkeypatch, "peft")

    def no_base(*args, **kwargs):
        raise AssertionError("the base was loaded before peft was checked")

    monkeypatch.setattr("hf_specdec.medusa.model.load_base", no_base)
    monkeypatch.setattr("hf_specdec.medusa.model.read_checkpoint", lambda directory, name: None)
    with pytest.raises(extras.MissingExtraError, match=r"heads trained with LoRA adapters .* needs peft"):
        MedusaForCausalLM.from_pretrained(folder)
