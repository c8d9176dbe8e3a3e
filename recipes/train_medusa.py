"""Train Medusa heads for any causal LM.

    python recipes/train_medusa.py --base smollm2-135m --data conversations.jsonl --num_heads 4 \
        --output_dir heads/smollm2 [--self_distill] [--cache_hidden_states] [--lora] [--push_to_hub] [--dry_run]

Every `TrainingArguments` option works too (--num_train_epochs, --learning_rate, --per_device_train_batch_size,
--gradient_accumulation_steps, --bf16, --save_steps, --resume_from_checkpoint, ...). On several processes:
`accelerate launch --config_file recipes/accelerate/ddp.yaml recipes/train_medusa.py ...` or `torchrun`. See
docs/training.md.
"""

from __future__ import annotations

import shlex
import sys

from transformers import HfArgumentParser, TrainingArguments

from hf_specdec.extras import MissingExtraError, require


def main(argv: list[str] | None = None) -> None:
    """Train heads as the command line `argv` (default: `sys.argv[1:]`) asks. A missing optional dependency (the
    `[train]` extra; gguf, of `[models]`, for a zoo base still to convert) ends the run at once, before any model
    loads, with one line naming the package and the command that installs it."""
    try:
        require("train", "datasets", "peft", purpose="Training heads")
        from accelerate import PartialState

        from hf_specdec.training import MedusaTrainingConfig, train_medusa

        parser = HfArgumentParser((MedusaTrainingConfig, TrainingArguments))
        config, training_args = parser.parse_args_into_dataclasses(args=argv)
        arguments = sys.argv[1:] if argv is None else argv
        if config.dry_run:
            from hf_specdec.training.plan import plan_training

            print(plan_training(config, training_args))
            return
        train_medusa(config, training_args, command=shlex.join(["python", "recipes/train_medusa.py", *arguments]))
        # Every process leaves together and closes its group: one left to interpreter shutdown can abort a rank
        # (gloo: "terminate called without an active exception") after the heads are saved.
        state = PartialState()
        state.wait_for_everyone()
        state.destroy_process_group()
    except MissingExtraError as error:
        raise SystemExit(f"train_medusa.py: error: {error}") from None


if __name__ == "__main__":
    main()
