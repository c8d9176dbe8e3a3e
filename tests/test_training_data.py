"""Data sets as they come: a split other than `train` (ultrachat's `train_sft`) of a data set repository laid out as
on the Hub, and conversations in a column of another name."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from hf_specdec.training import load_records, tokenize_records
from hf_specdec.training.data import to_messages
from tests.recipe import recipe_main
from tests.test_training import _conversations, tiny_tokenizer
from tests.tiny_models import tiny_model


def _dialogues(n: int, seed: int) -> list[dict]:
    """Conversations under `dialogue`, as `role`/`content` turns (ultrachat's layout, another column name)."""
    records = []
    for record in _conversations(n, seed=seed):
        turns = [
            {"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
            for t in record["conversations"]
        ]
        records.append({"prompt_id": f"p{len(records)}", "dialogue": turns})
    return records


def _repository(folder: Path) -> Path:
    """A data set repository with the splits `train_sft` (12 rows) and `test_sft` (4 rows), as on the Hub."""
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_list(_dialogues(12, seed=1)).to_parquet(folder / "data" / "train_sft-00000-of-00001.parquet")
    datasets.Dataset.from_list(_dialogues(4, seed=2)).to_parquet(folder / "data" / "test_sft-00000-of-00001.parquet")
    (folder / "README.md").write_text("---\nlicense: mit\n---\n")
    return folder


def test_a_split_other_than_train_and_a_messages_column(tmp_path: Path) -> None:
    repository = _repository(tmp_path / "ultrachat")
    train_sft = load_records(str(repository), split="train_sft")
    assert len(train_sft) == 12 and len(load_records(str(repository), split="test_sft")) == 4
    with pytest.raises(ValueError, match="train"):
        load_records(str(repository), split="train")
    files = tmp_path / "files.jsonl"
    files.write_text(json.dumps(_dialogues(1, seed=3)[0]))
    with pytest.raises(ValueError, match="one split"):
        load_records(str(files), split="train_sft")

    assert to_messages(train_sft[0], "dialogue")[0]["role"] == "user"
    with pytest.raises(ValueError, match="needs `messages`"):
        to_messages(train_sft[0])
    with pytest.raises(ValueError, match="no conversation in 'chat'"):
        to_messages(train_sft[0], "chat")
    tokenized = tokenize_records(train_sft, tiny_tokenizer(), max_length=64, messages_column="dialogue")
    assert len(tokenized) == 12
    plain = datasets.Dataset.from_list([{"body": "t5 t6 t7"}])
    assert tokenize_records(plain, tiny_tokenizer(), text_column="body")[0]["labels"] == [5, 6, 7]


def test_recipe_trains_on_a_named_split(tmp_path: Path) -> None:
    repository = _repository(tmp_path / "ultrachat")
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    main = recipe_main()
    out = tmp_path / "heads"
    main(
        [
            "--base", str(base_dir), "--data", str(repository), "--dataset_split", "train_sft",
            "--messages_column", "dialogue", "--num_heads", "2", "--eval_fraction", "0.25", "--output_dir", str(out),
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
        ]
    )  # fmt: skip
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["extra"]["training_config"]["dataset_split"] == "train_sft"
    assert len(config["measured_top1"]) == 2
    metrics = json.loads((out / "eval_metrics.json").read_text())
    assert "eval_head1_top1" in metrics
