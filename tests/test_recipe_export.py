"""The training recipe's `--export_to`: heads every engine takes, written beside the library's own; heads an
engine cannot take refused before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import TrainingArguments

from hf_specdec.training import MedusaTrainingConfig, train_medusa
from tests.engine_loaders import tensorrt_llm_logits, tgi_speculative_logits, vllm_logits
from tests.test_training import _conversations, tiny_tokenizer
from tests.tiny_models import tiny_model


def test_recipe_exports_for_every_engine(tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(16)))
    out = tmp_path / "heads"
    config = MedusaTrainingConfig(
        base=str(base_dir), data=str(data), num_heads=2, eval_fraction=0.0, export_to="vllm,tgi,tensorrt-llm"
    )
    arguments = TrainingArguments(
        output_dir=str(out), max_steps=3, per_device_train_batch_size=4, report_to="none", save_strategy="no"
    )
    model = train_medusa(config, arguments)
    hidden = torch.randn(3, model.config.hidden_size)
    lm_head = model.base.get_output_embeddings().weight
    expected = model.heads(hidden, model.base.get_output_embeddings())
    torch.testing.assert_close(vllm_logits(out / "serving" / "vllm", hidden, 2), expected)
    torch.testing.assert_close(tgi_speculative_logits(out / "serving" / "tgi", hidden, lm_head), expected)
    torch.testing.assert_close(tensorrt_llm_logits(out / "serving" / "tensorrt-llm", hidden), expected)
    assert json.loads((out / "serving" / "tgi" / "config.json").read_text())["base_model_name_or_path"] == str(base_dir)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"head_type": "recurrent", "export_to": "vllm"}, "vllm serves Medusa heads only"),
        ({"head_vocab_size": 100, "export_to": "tgi"}, "draft vocabulary of 100 tokens: tgi has no map"),
        ({"head_vocab_size": 100, "export_to": "vllm"}, "draft vocabulary of 100 tokens: vLLM has a map"),
        ({"lora": True, "export_to": "vllm"}, "with --lora the base trains too"),
        ({"export_to": "vllm,triton"}, "Unknown engine 'triton'"),
    ],
)
def test_recipe_refuses_heads_an_engine_cannot_take_before_training(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MedusaTrainingConfig(base="any", data="any", **settings)
    MedusaTrainingConfig(base="any", data="any", export_to="vllm,tgi,tensorrt-llm")  # Medusa heads, every token
