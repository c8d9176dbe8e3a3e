"""`MedusaTrainer`: transformers' `Trainer` with the Medusa objective, so that `TrainingArguments`, accelerate
(DDP, FSDP, DeepSpeed), checkpointing, resuming and evaluation work as for any model.

- Medusa-1: the base is frozen; only the heads train (from live base forwards, or from cached hidden states).
- Medusa-2: the base trains too, through PEFT LoRA adapters; to keep the base's own predictions where they
  were, its next-token distribution is distilled from the frozen base (adapters disabled) with a KL term.

Every step goes through the model Trainer wrapped (`MedusaForCausalLM.forward` computes the objective), so a
distributed wrapper synchronises the gradients. Evaluation is Trainer's own loop: `prediction_step` returns,
per example, how often each head's label was its rank-r candidate, Trainer gathers those across processes, and
[`HeadMetrics`] turns them into accuracies and the expected tau.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Trainer
from transformers.trainer import TRAINING_ARGS_NAME

from hf_specdec.medusa.model import ADAPTER_FOLDER, WEIGHTS_NAME, MedusaForCausalLM
from hf_specdec.training.metrics import TOP_K, HeadMetrics


class MedusaTrainer(Trainer):
    """A `Trainer` for `MedusaForCausalLM`. All other arguments are `Trainer`'s; `compute_metrics` defaults to
    [`HeadMetrics`].

    Args:
        head_decay (`float`): head k's loss weight is `head_decay ** k` (Medusa: 0.8).
        distill_weight (`float`): weight of the KL to the frozen base (Medusa-2 with LoRA only).
        tree_nodes (`int`): node budget of the tree evaluated for the expected tau.
        feature_weight (`float`): EAGLE heads: the weight of their feature regression.
        soft_targets (`bool`): heads learn the base's whole next-token distributions, not its tokens (see
            `hf_specdec.medusa.loss.medusa_objective`).
        relabel_with_base (`bool`): every label becomes the base's own greedy choice there, computed in the step
            from the base's states (the data then only supplies the text; see `MedusaForCausalLM.forward`).
    """

    def __init__(
        self,
        *args: Any,
        head_decay: float = 0.8,
        distill_weight: float = 1.0,
        tree_nodes: int = 16,
        soft_targets: bool = False,
        feature_weight: float = 1.0,
        relabel_with_base: bool = False,
        **kwargs: Any,
    ) -> None:
        model = kwargs.get("model", args[0] if args else None)
        if kwargs.get("compute_metrics") is None and isinstance(model, MedusaForCausalLM):
            kwargs["compute_metrics"] = HeadMetrics(model.config.num_heads, tree_nodes)
        super().__init__(*args, **kwargs)
        self.soft_targets = soft_targets
        self.head_decay = head_decay
        self.distill_weight = distill_weight
        self.tree_nodes = tree_nodes
        self.feature_weight = feature_weight
        self.relabel_with_base = relabel_with_base

    @property
    def medusa(self) -> MedusaForCausalLM:
        model = self.accelerator.unwrap_model(self.model)
        assert isinstance(model, MedusaForCausalLM)
        return model

    def _objective_settings(self) -> dict[str, Any]:
        return {
            "head_decay": self.head_decay,
            "soft_targets": self.soft_targets,
            "distill_weight": self.distill_weight,
            "feature_weight": self.feature_weight,
            "relabel_with_base": self.relabel_with_base,
        }

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
        rank_top_k: int = 0,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective, from the forward of `model` as Trainer passes it (wrapped for distributed training).
        Its loss is a mean over the batch's positions; Trainer scales it for gradient accumulation."""
        outputs = model(**inputs, **self._objective_settings(), rank_top_k=rank_top_k)
        return (outputs["loss"], outputs) if return_outputs else outputs["loss"]

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """`(loss, label_ranks, measured)`: `label_ranks` `(batch, heads, TOP_K + 1)` counts per example how often
        each head's label was its rank-r candidate (the last column: further down, or outside its vocabulary),
        `measured` `(batch, heads)` how many positions were measured. Per example, so Trainer's gathering across
        processes (which drops the duplicates that pad the last batch) gives the data set's counts."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True, rank_top_k=TOP_K)
        loss = loss.detach().mean()
        if prediction_loss_only:
            return loss, None, None
        ranks = outputs["label_ranks"]
        return loss, ranks, ranks.sum(dim=-1)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Save the heads (and LoRA adapters, if any) as a `MedusaForCausalLM` checkpoint, from the process that
        saves only; `state_dict` is the whole model's when FSDP or DeepSpeed gathered it."""
        if not self.args.should_save:
            return
        folder = output_dir or self.args.output_dir
        self.medusa.save_pretrained(folder, state_dict=state_dict)
        torch.save(self.args, Path(folder) / TRAINING_ARGS_NAME)  # as Trainer's own checkpoints keep them

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load the heads (and adapters) of a checkpoint this trainer saved; Trainer then restores the optimizer,
        scheduler, RNG states and step from the same folder."""
        folder = Path(resume_from_checkpoint)
        if not (folder / WEIGHTS_NAME).exists():
            raise ValueError(
                f"Can't find a valid checkpoint at {resume_from_checkpoint}: no {WEIGHTS_NAME} (heads saved by "
                "MedusaTrainer)."
            )
        from safetensors.torch import load_file

        medusa = self.medusa
        state = load_file(folder / WEIGHTS_NAME, device=str(next(medusa.heads.parameters()).device))
        medusa.heads.load_state_dict(_placed_like(state, medusa.heads.state_dict()))
        if (folder / ADAPTER_FOLDER).exists():
            from peft import set_peft_model_state_dict
            from peft.utils import load_peft_weights

            set_peft_model_state_dict(medusa.base, load_peft_weights(str(folder / ADAPTER_FOLDER)))

    def _load_best_model(self) -> None:
        self._load_from_checkpoint(self.state.best_model_checkpoint)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """The library's card (`hf_specdec.medusa.card`) instead of Trainer's generic one, so that a push by
        Trainer keeps it."""
        if self.is_world_process_zero():
            from hf_specdec.medusa.card import model_card

            model_card(self.medusa.config, self.hub_model_id).save(Path(self.args.output_dir) / "README.md")


def _placed_like(state: dict[str, torch.Tensor], current: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's full tensors placed as the module's own are: under FSDP2 parameters are `DTensor`s, each
    process holding a shard, and each process keeps its shard of the full tensor (the same on every process)."""
    try:
        from torch.distributed.tensor import DTensor, distribute_tensor
    except ImportError:  # torch < 2.5 keeps them private
        from torch.distributed._tensor import DTensor, distribute_tensor

    placed = {}
    for name, tensor in state.items():
        own = current.get(name)
        if isinstance(own, DTensor):
            tensor = distribute_tensor(tensor.to(own.dtype), own.device_mesh, own.placements)
        placed[name] = tensor
    return placed
