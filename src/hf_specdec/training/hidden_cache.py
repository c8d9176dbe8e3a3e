"""Cache the frozen base's last hidden states once, so Medusa-1 heads train without running the base.

On a CPU the base's forward dominates training time; with a frozen base its hidden states never change,
so they are computed once per example, stored with `datasets` (float16, on disk) and reused every epoch.
Under `accelerate launch` / `torchrun` each process computes a contiguous shard of the examples on its own
device; the main process joins the shards into the one cache every process then loads.
"""

from __future__ import annotations

import hashlib
import inspect
import shutil
from pathlib import Path

import datasets
import torch
from accelerate import PartialState
from transformers import PreTrainedModel

from hf_specdec.medusa.labels import base_labels
from hf_specdec.training.collator import MedusaCollator
from hf_specdec.training.processes import main_process_value


@torch.no_grad()
def cache_hidden_states(
    base: PreTrainedModel,
    tokenized: datasets.Dataset,
    directory: str | Path,
    pad_token_id: int,
    batch_size: int = 8,
    relabel: bool = False,
    layers: tuple[int, ...] = (-1,),
) -> datasets.Dataset:
    """Add a `hidden_states` column `(seq, hidden)` (the base's last hidden states, after its final norm) to a
    tokenised data set, saved under `directory` and reloaded from there if it already exists.

    `layers` chooses other hidden states (indices of `output_hidden_states`), concatenated in that order: EAGLE-3
    heads read three of the base's layers and learn from its last one (`SequenceHeads.state_layers`).

    With `relabel`, the same forward also replaces every label by the base's own greedy prediction there
    (see [`base_labels`]): heads then learn what the base would write, on any text, without generating.

    The folder name should identify the base, the data and `relabel` (the recipe uses the data set's
    fingerprint).
    """
    directory = Path(main_process_value(str(directory)))
    if (directory / "dataset_info.json").exists():
        return numpy_states(datasets.load_from_disk(str(directory)))
    collate = MedusaCollator(pad_token_id)
    # Only relabelling reads the logits: otherwise the lm_head runs on one position (a sixth of a Qwen2.5's cost).
    takes_logits_to_keep = "logits_to_keep" in inspect.signature(base.forward).parameters
    skip_logits = {"logits_to_keep": 1} if takes_logits_to_keep and not relabel else {}
    width = len(layers) * base.config.get_text_config(decoder=True).hidden_size

    def add_hidden(batch: dict[str, list]) -> dict[str, list]:
        examples = [
            {"input_ids": i, "labels": label} for i, label in zip(batch["input_ids"], batch["labels"], strict=True)
        ]
        padded = collate(examples)
        out = base(
            input_ids=padded["input_ids"].to(base.device),
            attention_mask=padded["attention_mask"].to(base.device),
            output_hidden_states=list(layers),
            **skip_logits,
        )
        states = torch.cat([out.hidden_states[i] for i in layers], dim=-1).to(torch.float16).cpu()
        columns = {"hidden_states": [s[: len(i)].numpy() for s, i in zip(states, batch["input_ids"], strict=True)]}
        if relabel:
            labels = base_labels(padded["labels"], out.logits.argmax(dim=-1).cpu())
            columns["labels"] = [row[: len(i)].tolist() for row, i in zip(labels, batch["input_ids"], strict=True)]
        return columns

    features = tokenized.features.copy()
    features["hidden_states"] = datasets.Array2D(shape=(None, width), dtype="float16")
    state = PartialState()

    def compute(examples: datasets.Dataset, folder: Path) -> None:
        # An explicit fingerprint: by default `datasets` would hash `add_hidden`, pickling the whole base with it
        # (tens of GB of memory for a 1.5B model).
        fingerprint = f"{examples._fingerprint}-{folder.name}-hidden"
        examples.map(
            add_hidden,
            batched=True,
            batch_size=batch_size,
            features=features,
            desc="caching base hidden states",
            new_fingerprint=hashlib.sha256(fingerprint.encode()).hexdigest()[:16],
        ).save_to_disk(str(folder))

    if state.num_processes == 1:
        compute(tokenized, directory)
        return numpy_states(datasets.load_from_disk(str(directory)))
    count, index = state.num_processes, state.process_index
    parts = [directory.with_name(f"{directory.name}.part{i}-of-{count}") for i in range(count)]
    if not (parts[index] / "dataset_info.json").exists():
        compute(tokenized.shard(num_shards=count, index=index, contiguous=True), parts[index])
    state.wait_for_everyone()
    if state.is_main_process:
        datasets.concatenate_datasets([datasets.load_from_disk(str(part)) for part in parts]).save_to_disk(
            str(directory)
        )
        for part in parts:
            shutil.rmtree(part)
    state.wait_for_everyone()
    return numpy_states(datasets.load_from_disk(str(directory)))


def numpy_states(dataset: datasets.Dataset) -> datasets.Dataset:
    """`dataset` with its `hidden_states` read as numpy arrays (its other columns as they are): read as Python lists,
    a batch of Qwen2.5-1.5B's states costs seconds to convert, a large share of a training step."""
    return dataset.with_format("numpy", columns=["hidden_states"], output_all_columns=True)
