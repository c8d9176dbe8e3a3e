"""What a training run will do and how long it will take, before it does it (`--dry_run`).

The data is read and counted (tokenised, or its prompts counted where the base is to write the replies), and each
stage's cost is measured by running one batch of it on this machine, with the run's own settings: a batch of
self-distillation, a batch of the base's states, and training steps of the heads (on a batch of the data's median
shape). Nothing is written to the output folder; a run of hours announces its length in a minute or two.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, TrainingArguments

from hf_specdec.heartbeat import heartbeat
from hf_specdec.medusa import MedusaForCausalLM
from hf_specdec.medusa.labels import IGNORE_INDEX
from hf_specdec.training.data import tokenize_records
from hf_specdec.training.metrics import TOP_K
from hf_specdec.training.pipeline import DTYPES, MedusaTrainingConfig, source_records
from hf_specdec.training.self_distill import (
    by_prompt_length,
    generate_replies,
    prompt_batch,
    prompt_messages,
    prompt_text,
)
from hf_specdec.zoo import drop_quantization_flags, load_model


@dataclass
class Stage:
    """One stage of a run: what it works on, and the seconds it will take (`None`: nothing to do)."""

    name: str
    work: str
    seconds: float | None = None


@dataclass
class TrainingPlan:
    """A run's data and stages (see [`plan_training`])."""

    examples: int
    train_examples: int
    eval_examples: int
    tokens: int
    labelled_tokens: int
    steps: int
    device: str = "cpu"
    stages: list[Stage] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(stage.seconds or 0.0 for stage in self.stages)

    def __str__(self) -> str:
        lines = [
            f"Plan (a dry run: nothing trained or written; each stage timed on one batch here, on {self.device}):",
            f"  data: {self.examples:,} examples, {self.tokens:,} tokens ({self.labelled_tokens:,} labelled); "
            f"{self.train_examples:,} to train on, {self.eval_examples:,} to evaluate on",
        ]
        for stage in self.stages:
            cost = "" if stage.seconds is None else f": {_minutes(stage.seconds)}"
            lines.append(f"  {stage.name}: {stage.work}{cost}")
        lines.append(f"  in all: {_minutes(self.seconds)}")
        return "\n".join(lines)


def plan_training(config: MedusaTrainingConfig, training_args: TrainingArguments) -> TrainingPlan:
    """The plan of `train_medusa(config, training_args)`: its data counted, each stage timed on one batch.

    Token counts of data the base is to write (`--self_distill`) are upper bounds: prompts plus
    `distill_max_new_tokens` each (replies can stop earlier).
    """
    if config.lora:
        raise ValueError("--dry_run plans runs whose base is frozen; with --lora it trains: drop one.")
    with heartbeat(f"planning: loading {config.base}"):
        base, tokenizer = load_model(config.base, dtype=DTYPES[config.dtype])
    drop_quantization_flags(base)
    base.to(training_args.device)
    sources = [config.data] if config.self_distill else [source for source in config.data.split(",") if source]
    records = [source_records(config, source, config.max_examples) for source in sources]
    if config.self_distill:
        prompts = [m for part in records for r in part if (m := prompt_messages(r, config.messages_column))]
        texts = [prompt_text(tokenizer, m) for m in prompts]
        prompt_lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        lengths = [min(p + config.distill_max_new_tokens, config.max_length) for p in prompt_lengths]
        labelled = [n - p for n, p in zip(lengths, prompt_lengths, strict=True)]
    else:
        tokenized = [tokenize_records(part, tokenizer, config.max_length, config.messages_column, config.text_column)
                     for part in records]  # fmt: skip
        lengths = [len(ids) for part in tokenized for ids in part["input_ids"]]
        labelled = [sum(label != IGNORE_INDEX for label in row) for part in tokenized for row in part["labels"]]
    if not lengths:
        raise ValueError(f"--data {config.data} holds no example to train on.")
    held_out = sum(math.ceil(len(part) * (config.eval_fraction or 0.0)) for part in records)
    examples = len(lengths)
    world = training_args.world_size * training_args.gradient_accumulation_steps
    per_step = training_args.per_device_train_batch_size * world
    steps = training_args.max_steps
    if steps <= 0:
        steps = math.ceil(math.ceil((examples - held_out) / per_step) * training_args.num_train_epochs)
    evaluated = len(source_records(config, config.eval_data, None)) if config.eval_data else held_out
    plan = TrainingPlan(examples, examples - held_out, evaluated, sum(lengths), sum(labelled), steps)
    plan.device = str(base.device)
    shape = (int(statistics.median(lengths)), int(statistics.median(labelled)))
    model = _heads(config, base)
    speculative = config.distill_kwargs(base)  # empty without --distill_draft / --distill_prompt_lookup
    if config.self_distill:
        with heartbeat("planning: timing self-distillation on one batch"):
            stage = _self_distill_stage(config, base, tokenizer, prompts, training_args.world_size, speculative)
        plan.stages.append(stage)
    if config.eval_data and (config.self_distill or config.eval_self_distill):
        held = source_records(config, config.eval_data, None)
        eval_prompts = [m for r in held if (m := prompt_messages(r, config.messages_column))]
        stage = _self_distill_stage(config, base, tokenizer, eval_prompts, training_args.world_size, speculative)
        plan.stages.append(Stage(f"{stage.name} of --eval_data", stage.work, stage.seconds))
    if config.cache_hidden_states and not config.self_distill:
        rate = _states_seconds_per_token(model, shape, training_args)
        plan.stages.append(Stage("hidden states", f"cached once, {plan.tokens:,} tokens", rate * plan.tokens))
    cached = config.cache_hidden_states
    settings = {"soft_targets": config.soft_targets, "relabel_with_base": config.relabel_with_base and not cached}
    with heartbeat("planning: timing a training step"):
        step = _step_seconds(model, shape, training_args, cached, settings)
    where = "from cached states" if cached else "the base's states computed in each step"
    plan.stages.append(
        Stage("training", f"{steps:,} steps of {per_step} examples, {where}, {step:.2f} s a step", step * steps)
    )
    if evaluated:
        batches = math.ceil(evaluated / (training_args.per_device_eval_batch_size * training_args.world_size))
        seconds = _step_seconds(model, shape, training_args, cached, settings, train=False) * batches
        plan.stages.append(Stage("evaluation", f"{evaluated:,} examples", seconds))
    return plan


def _heads(config: MedusaTrainingConfig, base: PreTrainedModel) -> MedusaForCausalLM:
    """Fresh heads of the run's shape (a draft vocabulary of the run's size, of any tokens: the cost is the same)."""
    head_config = config.head_config()
    token_ids = None
    if config.head_vocab_size is not None:
        vocab = base.get_output_embeddings().weight.shape[0]
        token_ids = torch.arange(min(config.head_vocab_size, vocab))
    model = MedusaForCausalLM.from_base(base, head_config, token_ids=token_ids).freeze_base()
    model.heads.float()
    return model


def _batch(model: MedusaForCausalLM, shape: tuple[int, int], size: int) -> dict[str, torch.Tensor]:
    length, labelled = shape
    vocab = model.base.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (size, length), generator=generator)
    labels = ids.clone()
    labels[:, : length - labelled] = IGNORE_INDEX
    device = model.base.device
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device), "labels": labels.to(device)}


def _autocast(model: MedusaForCausalLM, training_args: TrainingArguments) -> torch.autocast:
    dtype = torch.bfloat16 if training_args.bf16 else torch.float16
    return torch.autocast(model.base.device.type, dtype=dtype, enabled=training_args.bf16 or training_args.fp16)


def _states(model: MedusaForCausalLM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model._base_hidden_states(batch["input_ids"], batch["attention_mask"])


def _states_seconds_per_token(
    model: MedusaForCausalLM, shape: tuple[int, int], training_args: TrainingArguments
) -> float:
    batch = _batch(model, shape, training_args.per_device_train_batch_size)
    _states(model, batch)  # warm
    start = time.perf_counter()
    _states(model, batch)
    return (time.perf_counter() - start) / batch["input_ids"].numel()


def _step_seconds(
    model: MedusaForCausalLM,
    shape: tuple[int, int],
    training_args: TrainingArguments,
    cached: bool,
    settings: dict[str, bool],
    train: bool = True,
    repeats: int = 1,
) -> float:
    """Seconds of one training step (forward, backward, optimizer) or, with `train=False`, one evaluation batch."""
    size = training_args.per_device_train_batch_size if train else training_args.per_device_eval_batch_size
    batch = _batch(model, shape, size)
    if cached:
        batch["hidden_states"] = _states(model, batch)
    optimizer = torch.optim.AdamW([p for p in model.heads.parameters() if p.requires_grad])
    timings = []
    for _ in range(repeats + 1):  # the first one warms up
        start = time.perf_counter()
        with _autocast(model, training_args), torch.set_grad_enabled(train):
            out = model(**batch, **settings, rank_top_k=0 if train else TOP_K)
        if train:
            out["loss"].backward()
            optimizer.step()
            optimizer.zero_grad()
        timings.append(time.perf_counter() - start)
    model.heads.zero_grad(set_to_none=True)
    return statistics.median(timings[1:]) * training_args.gradient_accumulation_steps if train else min(timings[1:])


def _self_distill_stage(
    config: MedusaTrainingConfig,
    base: PreTrainedModel,
    tokenizer: object,
    prompts: list[list[dict[str, str]]],
    processes: int,
    speculative: dict[str, Any] | None = None,
) -> Stage:
    """One batch of generation, of the median prompt length, timed (what the longest-first batches average); with
    `speculative` arguments, timed both plainly and with them, and their replies compared."""
    ordered = [m for _, m in by_prompt_length(tokenizer, list(enumerate(prompts)))]  # type: ignore[arg-type]
    middle = max(0, len(ordered) // 2 - config.distill_batch_size // 2)
    batch = ordered[middle : middle + config.distill_batch_size]
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # type: ignore[attr-defined]
    try:
        inputs = prompt_batch(tokenizer, batch, base.device)  # type: ignore[arg-type]
    finally:
        tokenizer.padding_side = padding_side  # type: ignore[attr-defined]
    pad = tokenizer.pad_token_id  # type: ignore[attr-defined]
    batches = math.ceil(len(prompts) / config.distill_batch_size / processes)
    work = f"{len(prompts):,} replies of up to {config.distill_max_new_tokens} tokens, {batches:,} batches"
    plain, plain_seconds = _timed_replies(base, inputs, config.distill_max_new_tokens, pad, None)
    if not speculative:
        return Stage("self-distillation", f"{work} of {config.distill_batch_size}, {plain_seconds:.1f} s a batch",
                     plain_seconds * batches)  # fmt: skip
    drafted, seconds = _timed_replies(base, inputs, config.distill_max_new_tokens, pad, speculative)
    same = sum(torch.equal(a, b) for a, b in zip(plain, drafted, strict=True))
    work += (
        f" of {config.distill_batch_size}, {seconds:.1f} s a batch with drafting against {plain_seconds:.1f} s plain "
        f"({plain_seconds / seconds:.2f}x; {same} of {len(batch)} replies the same)"
    )
    return Stage("self-distillation", work, seconds * batches)


def _timed_replies(
    base: PreTrainedModel, inputs: Any, max_new_tokens: int, pad: int | None, speculative: dict[str, Any] | None
) -> tuple[torch.Tensor, float]:
    """One batch's greedy replies and the seconds they took."""
    start = time.perf_counter()
    with torch.no_grad():
        out = generate_replies(base, inputs, max_new_tokens, pad, speculative, do_sample=False)
    return out, time.perf_counter() - start


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
