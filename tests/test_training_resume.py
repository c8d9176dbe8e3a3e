"""Resuming: a run stopped at step k and resumed from its checkpoint ends with the heads of the run that was
never stopped (heads, optimizer, scheduler, RNG and data position all come back)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import safetensors.torch
import torch
from transformers import TrainerCallback, TrainingArguments

from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.training import MedusaCollator, MedusaTrainer, tokenize_records
from tests.recipe import recipe_main
from tests.test_training import _conversations, tiny_tokenizer
from tests.tiny_models import tiny_model

STEPS, STOP = 6, 3


class StopAt(TrainerCallback):
    """Stops training after step `step` (after that step's checkpoint is written): a preemption."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _trainer(output_dir: Path, init_seed: int = 1, callbacks=None, head_type: str = "medusa") -> MedusaTrainer:
    torch.manual_seed(init_seed)
    config = MedusaConfig(num_heads=2, head_type=head_type, share_lm_head=False)
    model = MedusaForCausalLM.from_base(tiny_model("llama", seed=0), config)
    data = tokenize_records(datasets.Dataset.from_list(_conversations(16)), tiny_tokenizer(), max_length=64)
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,  # 4 steps an epoch: the stop falls inside the first epoch
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_steps=STEPS,
        save_strategy="steps",
        save_steps=STOP,
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        use_cpu=True,
        seed=7,
    )
    return MedusaTrainer(
        model=model.freeze_base(),
        args=args,
        train_dataset=data,
        data_collator=MedusaCollator(0),
        callbacks=callbacks,
    )


def _heads(trainer: MedusaTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.medusa.heads.state_dict().items()}


@pytest.mark.parametrize("head_type", ["medusa", "eagle3"])
def test_a_run_stopped_and_resumed_ends_as_the_run_never_stopped(tmp_path: Path, head_type: str) -> None:
    whole = _trainer(tmp_path / "whole", head_type=head_type)
    whole.train()
    expected = _heads(whole)

    stopped = _trainer(tmp_path / "stopped", callbacks=[StopAt(STOP)], head_type=head_type)
    stopped.train()
    assert stopped.state.global_step == STOP
    checkpoint = tmp_path / "stopped" / f"checkpoint-{STOP}"
    present = {p.name for p in checkpoint.iterdir()}
    assert {"medusa_heads.safetensors", "medusa_config.json", "optimizer.pt", "scheduler.pt"} <= present
    assert {"trainer_state.json", "rng_state.pth", "training_args.bin"} <= present  # as Trainer keeps them
    at_stop = _heads(stopped)
    assert any(not torch.equal(at_stop[k], v) for k, v in expected.items())  # the steps after k matter

    resumed = _trainer(tmp_path / "stopped", init_seed=99, head_type=head_type)  # fresh heads: the checkpoint's win
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == STEPS
    for name, tensor in _heads(resumed).items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no medusa_heads\.safetensors"):
        _trainer(tmp_path / "other").train(resume_from_checkpoint=str(tmp_path / "empty"))


@pytest.mark.parametrize("head_type", ["medusa", "eagle3"])
def test_recipe_resumes_from_a_checkpoint(tmp_path: Path, head_type: str) -> None:
    """`--resume_from_checkpoint` (a path, or `true` for the output folder's last checkpoint) continues the run
    the checkpoint came from, on the same data split."""
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(20)))
    main = recipe_main()

    def run(output: Path, *extra: str) -> dict[str, torch.Tensor]:
        main(
            [
                "--base", str(base_dir), "--data", str(data), "--num_heads", "2", "--cache_hidden_states",
                "--eval_fraction", "0.2", "--output_dir", str(output), "--max_steps", "4", "--save_steps", "2",
                "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--report_to", "none",
                "--head_type", head_type, *extra,
            ]
        )  # fmt: skip
        return safetensors.torch.load_file(output / "medusa_heads.safetensors")

    whole = run(tmp_path / "whole")
    resumed = run(tmp_path / "resumed", "--resume_from_checkpoint", str(tmp_path / "whole" / "checkpoint-2"))
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-6, msg=name)
    state = json.loads((tmp_path / "resumed" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    again = run(tmp_path / "whole", "--resume_from_checkpoint", "true")  # the last checkpoint: nothing left to do
    for name, tensor in whole.items():
        assert torch.equal(again[name], tensor), name
