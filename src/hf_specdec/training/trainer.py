"""`MedusaTrainer`: transformers' `Trainer` with the Medusa loss, so `TrainingArguments`, accelerate
(multi-GPU, DeepSpeed, FSDP), checkpointing and resuming all work as usual.

- Medusa-1: the base is frozen; only the heads train (from live base forwards, or from cached hidden states).
- Medusa-2: the base trains too, through PEFT LoRA adapters; to keep the base's own predictions where they
  were, its next-token distribution is distilled from the frozen base (adapters disabled) with a KL term.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional
from transformers import Trainer

from hf_specdec.medusa.loss import IGNORE_INDEX, head_weights, medusa_loss_from_hidden
from hf_specdec.medusa.model import MedusaForCausalLM
from hf_specdec.trees.static import build_tree, expected_accepted_length

TOP_K = 10  # ranks measured per head at evaluation: what trees of up to ~100 nodes are planned from


class MedusaTrainer(Trainer):
    """A `Trainer` for `MedusaForCausalLM`.

    Args:
        head_decay (`float`): head k's loss weight is `head_decay ** k` (Medusa: 0.8).
        distill_weight (`float`): weight of the KL to the frozen base (Medusa-2 with LoRA only).
        tree_nodes (`int`): node budget of the tree evaluated for the expected tau.
        soft_targets (`bool`): heads learn the base's whole next-token distributions, not its tokens (see
            `medusa_loss_from_hidden`).
        All other arguments are `Trainer`'s.
    """

    def __init__(
        self,
        *args: Any,
        head_decay: float = 0.8,
        distill_weight: float = 1.0,
        tree_nodes: int = 16,
        soft_targets: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.soft_targets = soft_targets
        self.head_decay = head_decay
        self.distill_weight = distill_weight
        self.tree_nodes = tree_nodes

    @property
    def medusa(self) -> MedusaForCausalLM:
        model = self.accelerator.unwrap_model(self.model)
        assert isinstance(model, MedusaForCausalLM)
        return model

    def _hidden_states(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's last hidden states, and the base's own loss term (0 unless the base trains)."""
        medusa = self.medusa
        if "hidden_states" in inputs:
            dtype = medusa.heads.dtype
            return inputs["hidden_states"].to(dtype), torch.zeros((), device=inputs["labels"].device)
        model_inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        if not medusa.base_trains:
            with torch.no_grad():
                hidden = medusa.base(**model_inputs, output_hidden_states=True).hidden_states[-1]
            return hidden.detach(), torch.zeros((), device=hidden.device)
        out = medusa.base(**model_inputs, output_hidden_states=True)
        with torch.no_grad(), medusa.base.disable_adapter():
            reference = medusa.base(**model_inputs).logits
        keep = inputs["labels"] != IGNORE_INDEX  # the positions whose predictions matter
        kl = functional.kl_div(
            functional.log_softmax(out.logits[keep].float(), dim=-1),
            functional.log_softmax(reference[keep].float(), dim=-1),
            log_target=True,
            reduction="batchmean",
        )
        return out.hidden_states[-1], self.distill_weight * kl

    def compute_loss(
        self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False, **kwargs: Any
    ) -> None:
        hidden, base_loss = self._hidden_states(inputs)
        medusa = self.medusa
        hidden = hidden.to(medusa.heads.dtype)  # heads train in their own dtype (float32)
        weights = head_weights(medusa.config.num_heads, self.head_decay)
        lm_head = medusa.base.get_output_embeddings()
        embeddings = medusa.base.get_input_embeddings()
        loss, _, outputs = medusa_loss_from_hidden(
            medusa.heads,
            lm_head,
            hidden,
            inputs["labels"],
            weights,
            embeddings,
            input_ids=inputs.get("input_ids"),
            soft_targets=self.soft_targets,
        )
        loss = loss + base_loss
        return (loss, {"heads": outputs}) if return_outputs else loss

    @torch.no_grad()
    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Loss, each head's top-1 and top-5 accuracy, and the expected tau of the best tree for them."""
        dataloader = self.get_eval_dataloader(eval_dataset)
        num_heads = self.medusa.config.num_heads
        hits = torch.zeros(num_heads, TOP_K)  # hits[k, r]: head k's label within its top r+1
        counts = torch.zeros(num_heads)
        losses = []
        self.model.eval()
        for inputs in dataloader:
            loss, outputs = self.compute_loss(self.model, self._prepare_inputs(inputs), return_outputs=True)
            losses.append(float(loss))
            for k, (logits, targets) in enumerate(outputs["heads"]):
                top = logits.topk(min(TOP_K, logits.shape[-1]), dim=-1).indices  # (M, <= TOP_K)
                found = (top == targets[:, None]).long().cumsum(dim=1).clamp_max(1).sum(dim=0).cpu().float()
                hits[k, : found.numel()] += found
                hits[k, found.numel() :] += found[-1] if found.numel() else 0.0
                counts[k] += targets.numel()
        top = hits / counts.clamp_min(1)[:, None]  # (K, TOP_K) top-r accuracy
        metrics = {f"{metric_key_prefix}_loss": sum(losses) / max(len(losses), 1)}
        for k in range(num_heads):
            metrics[f"{metric_key_prefix}_head{k}_top1"] = float(top[k, 0])
            metrics[f"{metric_key_prefix}_head{k}_top5"] = float(top[k, min(4, TOP_K - 1)])
        per_rank = torch.cat([top[:, :1], top[:, 1:] - top[:, :-1]], dim=1).clamp_min(0).tolist()
        self.last_accuracy = per_rank
        self.last_tree = build_tree(per_rank, self.tree_nodes)
        metrics[f"{metric_key_prefix}_expected_tau"] = 1.0 + expected_accepted_length(self.last_tree, per_rank)
        self.log(metrics)
        return metrics

    def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
        """Save the heads (and LoRA adapters, if any) only, as a `MedusaForCausalLM` checkpoint."""
        self.medusa.save_pretrained(output_dir or self.args.output_dir)
