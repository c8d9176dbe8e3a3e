"""How well trained heads guess a base's tokens on held-out data, outside a training run: the measurements a
training run records (`eval_metrics.json`), for any heads, on any data, e.g. every checkpoint of a run on one
fixed set to see how accuracy grows with the data trained on."""

from __future__ import annotations

import tempfile

import datasets
import torch
from transformers import PreTrainedTokenizerBase, TrainingArguments

from hf_specdec.medusa import MedusaForCausalLM
from hf_specdec.training.collator import MedusaCollator
from hf_specdec.training.trainer import MedusaTrainer


def evaluate_heads(
    model: MedusaForCausalLM,
    data: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    relabel_with_base: bool = False,
    tree_nodes: int = 16,
    batch_size: int = 8,
) -> dict[str, float]:
    """Held-out metrics of `model`'s heads on tokenised `data` (`tokenize_records`): `eval_head{k}_top{r}` and
    `eval_expected_tau`, as `train_medusa` records them (Trainer's evaluation loop with [`HeadMetrics`]).

    Args:
        model: heads on their base (frozen here).
        data: tokenised examples (`input_ids`, `labels`), or with cached `hidden_states`.
        tokenizer: the base's (its pad token pads batches).
        relabel_with_base: measure against the base's own greedy choice at each labelled position instead of the
            data's token (data the base did not write).
        tree_nodes: the node budget of the tree the expected tau is computed for.
        batch_size: examples per forward.
    """
    model.freeze_base()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            output_dir=scratch,
            per_device_eval_batch_size=batch_size,
            report_to=[],
            use_cpu=model.base.device.type == "cpu",
            bf16=model.base.dtype == torch.bfloat16,
        )
        trainer = MedusaTrainer(
            model=model,
            args=args,
            eval_dataset=data,
            data_collator=MedusaCollator(pad),
            tree_nodes=tree_nodes,
            relabel_with_base=relabel_with_base,
        )
        return trainer.evaluate()
