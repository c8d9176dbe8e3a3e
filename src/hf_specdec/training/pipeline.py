"""Train Medusa heads end to end: data, optional self-distillation, optional hidden-state cache, Trainer,
metrics, checkpoint, model card and upload. `recipes/train_medusa.py` wires command-line arguments to
`train_medusa`.

Launched on several processes (`accelerate launch`, `torchrun`), every process loads the base onto its own
device; data work that is cheap runs on the main process first and is read from the `datasets` cache by the
others (`TrainingArguments.main_process_first`), the expensive part (self-distillation, hidden states) is
split between the processes; Trainer synchronises the heads; the main process alone writes and uploads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments, set_seed

from hf_specdec.cli_args import AUTO_DTYPE, DTYPES, MODEL_DTYPES, model_dtype
from hf_specdec.drafters.vocab import count_tokens, frequent_tokens
from hf_specdec.generation.validation import eos_token_ids, output_vocab_size
from hf_specdec.medusa import MedusaConfig, MedusaForCausalLM
from hf_specdec.medusa.card import HEAD_NAMES
from hf_specdec.medusa.config import EAGLE3_LAYER_TYPES
from hf_specdec.medusa.model import ADAPTER_FOLDER, local_directory, state_layers
from hf_specdec.serving.export import check_exportable, engine_base_name, export_heads
from hf_specdec.training.collator import MedusaCollator
from hf_specdec.training.data import load_records, tokenize_records
from hf_specdec.training.hidden_cache import cache_hidden_states
from hf_specdec.training.metrics import rank_accuracies
from hf_specdec.training.self_distill import self_distill, self_distill_with_states
from hf_specdec.training.trainer import MedusaTrainer
from hf_specdec.trees.static import build_tree
from hf_specdec.zoo import ZOO, drop_quantization_flags, load_model

# What a checkpoint fixes about its heads: with --init_heads these come from it.
_HEAD_SHAPE = (
    "num_heads",
    "num_layers",
    "head_type",
    "share_lm_head",
    "head_vocab_size",
    "head_intermediate_size",
    "feature_layers",
    "norm_before_residual",
    "head_layer_type",
)
_CONFIG_NAME = {"head_intermediate_size": "intermediate_size"}  # what MedusaConfig calls it
METRICS_NAME = "eval_metrics.json"


@dataclass
class MedusaTrainingConfig:
    """What to train; every `TrainingArguments` option is available beside these."""

    base: str = field(metadata={"help": "Base model: a zoo name (e.g. smollm2-135m), a local folder or a Hub id."})
    data: str = field(
        metadata={"help": "Training data: JSON/JSONL/parquet files (comma-separated, or a folder) or a Hub data set."}
    )
    num_heads: int = field(default=4, metadata={"help": "Medusa heads."})
    num_layers: int = field(default=1, metadata={"help": "Residual blocks per head."})
    head_type: str = field(
        default="medusa",
        metadata={
            "help": "medusa: independent heads on the hidden state; recurrent: one drafter that also reads the "
            "tokens drafted before it (more accurate past the first depth); eagle: a one-layer decoder drafting the "
            "base's next features with its own attention over the whole context (EAGLE), trained unrolled to "
            "--num_heads depths; eagle3: EAGLE-3's published architecture (one Llama layer over three fused base "
            "layers, its own lm_head over a draft vocabulary: pair it with --head_vocab_size), served by vLLM "
            "after `hf-specdec export`."
        },
    )
    share_lm_head: bool | None = field(
        default=None,
        metadata={
            "help": "Heads project with the base's lm_head (default: yes, except EAGLE-3 heads, which never do)."
        },
    )
    head_vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "Heads propose only this many tokens, the most frequent in the training labels (much cheaper "
            "heads on large vocabularies, still lossless); default: every token."
        },
    )
    head_intermediate_size: int | None = field(
        default=None,
        metadata={"help": "EAGLE heads: their decoder's MLP width (default: the base's; narrower trains faster)."},
    )
    norm_before_residual: bool = field(
        default=False,
        metadata={
            "help": "EAGLE-3 heads: start their layer's residual stream at the normed fused state (the speculators "
            "variant) instead of the fused state itself."
        },
    )
    head_layer_type: str = field(
        default="llama",
        metadata={
            "help": "EAGLE-3 heads: their one layer, llama (what every engine serves) or qwen3 (with per-head query "
            "and key norms, vLLM's Eagle3Qwen3ForCausalLM)."
        },
    )
    feature_layers: list[int] | None = field(
        default=None,
        metadata={
            "help": "EAGLE-3 heads: the base's hidden states they fuse (indices of output_hidden_states; default: "
            "the inputs of layers 2, L // 2 and L - 3)."
        },
    )
    init_heads: str | None = field(
        default=None,
        metadata={
            "help": "Start from trained heads (a folder or Hub id of this library's checkpoints) instead of fresh "
            "ones, e.g. to fit published heads to your own data; their architecture and vocabulary are kept."
        },
    )
    dataset_split: str = field(
        default="train",
        metadata={
            "help": "Split of a Hub data set (or of a local data set repository folder) to train on, e.g. "
            "train_sft for HuggingFaceH4/ultrachat_200k."
        },
    )
    messages_column: str | None = field(
        default=None,
        metadata={
            "help": "Column holding each conversation (a list of turns with role/content or from/value keys); "
            "default: messages, else conversations."
        },
    )
    text_column: str = field(default="text", metadata={"help": "Column holding plain text records."})
    max_length: int = field(default=1024, metadata={"help": "Tokens per example, at most."})
    max_examples: int | None = field(
        default=None,
        metadata={
            "help": "Use only the first this many records of each data source (of all, with --self_distill; "
            "--eval_data is read whole)."
        },
    )
    eval_fraction: float | None = field(
        default=None,
        metadata={"help": "Share of each source's examples held out for evaluation (0.05; with --eval_data, 0)."},
    )
    eval_data: str | None = field(
        default=None,
        metadata={
            "help": "Evaluate on this data instead of a share of --data (files or a Hub data set, as --data; "
            "self-distilled, cached and relabelled as --data is): one fixed held-out set for runs that train on "
            "different amounts of data."
        },
    )
    self_distill: bool = field(default=False, metadata={"help": "Generate the replies with the base itself."})
    eval_self_distill: bool = field(
        default=False,
        metadata={
            "help": "Have the base write --eval_data's replies even without --self_distill: train on text anyone "
            "wrote (--relabel_with_base), evaluate on what the base writes, as at decoding time."
        },
    )
    distill_max_new_tokens: int = field(default=256, metadata={"help": "Reply length when self-distilling."})
    distill_batch_size: int = field(default=8, metadata={"help": "Batch size when self-distilling."})
    distill_draft: str | None = field(
        default=None,
        metadata={
            "help": "Write the self-distilled replies with speculative decoding, this draft model drafting (a zoo "
            "name, folder or Hub id sharing the base's tokenizer): the same greedy replies, sooner where drafting "
            "pays (--dry_run times both ways)."
        },
    )
    distill_prompt_lookup: int | None = field(
        default=None,
        metadata={
            "help": "Write the self-distilled replies with speculative decoding, prompt lookup drafting up to this "
            "many tokens (with --distill_draft, both draft)."
        },
    )
    cache_hidden_states: bool = field(default=False, metadata={"help": "Medusa-1: compute base states once."})
    relabel_with_base: bool = field(
        default=False,
        metadata={
            "help": "Replace each reply token by the base's own greedy prediction from the data's prefix "
            "(teacher-forced self-distillation: one forward, no generation), in the hidden-state pass with "
            "--cache_hidden_states, else in every training step."
        },
    )
    soft_targets: bool = field(
        default=False,
        metadata={
            "help": "Heads learn the base's whole next-token distribution at every position (KL), read off its "
            "hidden states at no extra cost, instead of its single tokens: more signal from the same data."
        },
    )
    lora: bool = field(default=False, metadata={"help": "Medusa-2: train the base too, through LoRA adapters."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    distill_weight: float = field(default=1.0, metadata={"help": "Medusa-2: KL weight to the frozen base."})
    head_decay: float = field(default=0.8, metadata={"help": "Head k's loss weight is head_decay ** k."})
    feature_weight: float = field(
        default=1.0,
        metadata={"help": "EAGLE heads: weight of the regression of their predicted features on the base's."},
    )
    tree_nodes: int = field(default=16, metadata={"help": "Node budget of the tree built from measured accuracies."})
    dtype: str = field(
        default="float32",
        metadata={"help": f"Base weights' dtype: {MODEL_DTYPES}; {AUTO_DTYPE}. The run records the one it used."},
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Print the plan (the data counted, each stage's minutes measured on one batch here) and stop "
            "before any long work; nothing is written."
        },
    )
    export_to: str | None = field(
        default=None,
        metadata={
            "help": "Also write the heads for these serving engines (comma-separated: vllm, tgi, tensorrt-llm) into "
            "OUTPUT_DIR/serving/ENGINE; checked before training (docs/serving.md)."
        },
    )

    def __post_init__(self) -> None:
        for engine in self.export_engines:
            if self.lora:
                raise ValueError("--export_to writes the heads alone, but with --lora the base trains too: drop one.")
            check_exportable(self, engine)
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype must be one of {MODEL_DTYPES}, got {self.dtype!r}.")
        if self.dtype == "auto":  # the run records the dtype it used
            chosen = model_dtype("auto", "cuda" if torch.cuda.is_available() else "cpu")
            self.dtype = str(chosen).removeprefix("torch.")
        if self.relabel_with_base and self.self_distill:
            raise ValueError("--relabel_with_base and --self_distill both label with the base's own tokens: pass one.")
        if self.relabel_with_base and self.lora:
            raise ValueError("--relabel_with_base labels with a frozen base's choices; --lora trains it: pass one.")
        if self.head_layer_type not in EAGLE3_LAYER_TYPES:
            raise ValueError(f"--head_layer_type is one of {EAGLE3_LAYER_TYPES}, got {self.head_layer_type!r}.")
        if self.head_layer_type != "llama" and self.head_type != "eagle3":
            raise ValueError("--head_layer_type chooses EAGLE-3 heads' layer: add --head_type eagle3 or drop it.")
        if self.head_type == "eagle3" and self.feature_weight != 1.0:
            raise ValueError("EAGLE-3 heads learn tokens only (no feature regression): drop --feature_weight.")
        if self.head_type in ("eagle", "eagle3") and self.lora:
            raise ValueError("EAGLE heads draft from a frozen base's features: drop --lora.")
        if self.cache_hidden_states and self.lora:
            raise ValueError("Cached hidden states need a frozen base; they cannot be combined with --lora.")
        if self.init_heads is not None:
            defaults = {f.name: f.default for f in fields(self)}
            if changed := [name for name in _HEAD_SHAPE if getattr(self, name) != defaults[name]]:
                raise ValueError(
                    "--init_heads keeps the heads' own architecture and vocabulary: drop "
                    + ", ".join(f"--{name}" for name in changed)
                    + "."
                )
        if self.eval_fraction is None:
            self.eval_fraction = 0.0 if self.eval_data else 0.05
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}.")
        drafted = bool(self.distill_draft) or self.distill_prompt_lookup is not None
        if drafted and not (self.self_distill or self.eval_self_distill):
            raise ValueError(
                "--distill_draft and --distill_prompt_lookup write self-distilled replies: add --self_distill (or "
                "--eval_self_distill)."
            )
        if drafted and self.cache_hidden_states:
            raise ValueError(
                "--cache_hidden_states keeps the states of a plain generation: drop it (the states are then "
                "computed in each training step) or drop --distill_draft / --distill_prompt_lookup."
            )
        if self.distill_prompt_lookup is not None and self.distill_prompt_lookup < 1:
            raise ValueError(f"--distill_prompt_lookup drafts at least 1 token, got {self.distill_prompt_lookup}.")
        if self.eval_self_distill and not self.eval_data:
            raise ValueError("--eval_self_distill self-distils --eval_data: add --eval_data.")
        if self.eval_data and self.eval_fraction:
            raise ValueError("--eval_data is the held-out set: drop --eval_fraction (or --eval_data to split --data).")
        self.head_config()  # the heads' settings are checked before any data work, which can take hours

    def distill_kwargs(self, base: PreTrainedModel) -> dict[str, Any]:
        """The speculative arguments self-distillation writes replies with (`--distill_draft`, loaded beside `base`
        in its dtype and on its device, and `--distill_prompt_lookup`); empty for plain generation."""
        kwargs: dict[str, Any] = {}
        if self.distill_draft:
            draft, _ = load_model(self.distill_draft, dtype=DTYPES[self.dtype])
            kwargs["assistant"] = draft.to(base.device)
        if self.distill_prompt_lookup is not None:
            kwargs["prompt_lookup_num_tokens"] = self.distill_prompt_lookup
        return kwargs

    def head_config(self) -> MedusaConfig:
        """The fresh heads' `MedusaConfig` these settings ask for (its fields checked)."""
        return MedusaConfig(
            num_heads=self.num_heads,
            num_layers=self.num_layers,
            head_type=self.head_type,
            share_lm_head=self.share_lm_head,
            intermediate_size=self.head_intermediate_size,
            feature_layers=self.feature_layers,
            norm_before_residual=self.norm_before_residual,
            layer_config=None if self.head_layer_type == "llama" else {"model_type": self.head_layer_type},
        )

    @property
    def export_engines(self) -> list[str]:
        """The engines of `--export_to`."""
        return [engine for engine in (self.export_to or "").split(",") if engine]


def train_medusa(
    config: MedusaTrainingConfig, training_args: TrainingArguments, command: str | None = None
) -> MedusaForCausalLM:
    """Train heads as configured, save them to `training_args.output_dir` (and upload them with
    `--push_to_hub`), and return the model. `command` (the command line that ran this) goes into the model card.
    """
    base, tokenizer = load_model(config.base, dtype=DTYPES[config.dtype])
    drop_quantization_flags(base)  # GGUF-loaded bases are dense but flagged quantized; Trainer would refuse
    base.to(training_args.device)  # this process's device (the data work below runs the base)
    # Trained heads are loaded before the data work (which can take hours), so a wrong path fails at once.
    warm = None if config.init_heads is None else _warm_start(config.init_heads, base)
    train, evaluation = _training_data(config, training_args, base, tokenizer, warm)
    model = _model_to_train(config, training_args, base, warm, train)
    trainer = _trainer(config, training_args, model, tokenizer, train, evaluation)
    trainer.train(resume_from_checkpoint=_resume_argument(training_args.resume_from_checkpoint))
    metrics = None if evaluation is None else _measure(trainer, config, model.config)
    if metrics is None and warm is not None:
        model.config.extra["measurements_from"] = config.init_heads  # not measured again: no held-out data
    _record_run(config, model.config, command)
    trainer.save_model(training_args.output_dir)  # the process that saves writes (FSDP/DeepSpeed gather first)
    if trainer.is_world_process_zero():
        _publish(config, training_args, model, tokenizer, metrics)
    trainer.accelerator.wait_for_everyone()
    return model


def _training_data(
    config: MedusaTrainingConfig,
    training_args: TrainingArguments,
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    warm: MedusaForCausalLM | None,
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """The training and held-out sets: every source tokenised (self-distilled, with the base's states when
    cached), split, and `--eval_data` when given."""
    output_dir = Path(training_args.output_dir)
    # With --self_distill, one generation over every source: its replies are one data set. Otherwise each source
    # is tokenised, cached and split on its own: adding a source to --data reuses the hidden states of the
    # others, and each keeps its evaluation examples.
    sources = [config.data] if config.self_distill else [source for source in config.data.split(",") if source]
    # The base's states the heads train on: the warm start's own (any layout it was loaded from), or fresh heads'.
    layers = state_layers(config.head_config() if warm is None else warm.config, base)
    speculative = config.distill_kwargs(base)
    parts = [
        _tokenize_part(config, training_args, base, tokenizer, source, output_dir, layers, distill_kwargs=speculative)
        for source in sources
    ]
    train, evaluation = _split(config, training_args, parts)
    if config.eval_data:
        evaluation = _tokenize_part(
            config, training_args, base, tokenizer, config.eval_data, output_dir, layers, "eval", speculative
        )
    speculative.clear()  # the draft model, if any, is not kept through training
    return train, evaluation


def _model_to_train(
    config: MedusaTrainingConfig,
    training_args: TrainingArguments,
    base: PreTrainedModel,
    warm: MedusaForCausalLM | None,
    train: datasets.Dataset,
) -> MedusaForCausalLM:
    """The heads to train (the warm start, or fresh ones seeded alike on every process) on the frozen base, in
    float32, with LoRA adapters on the base when asked."""
    if warm is not None:
        model = warm
        if (token_ids := model.heads.token_ids) is not None:
            model.config.extra["head_vocab_coverage"] = round(_coverage(train["labels"], base, token_ids), 4)
    else:
        set_seed(training_args.seed)  # fresh heads start the same in every run (and every process)
        model = _fresh_model(config, base, train["labels"])
    model.config.base_model_name_or_path = base_reference(config.base)
    model.freeze_base()
    model.heads.float()  # heads train in float32 whatever the base's dtype (fresh ones take the base's)
    if config.lora:
        from peft import LoraConfig, get_peft_model

        model.base = get_peft_model(
            base, LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, target_modules="all-linear")
        )
    return model


def _trainer(
    config: MedusaTrainingConfig,
    training_args: TrainingArguments,
    model: MedusaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    train: datasets.Dataset,
    evaluation: datasets.Dataset | None,
) -> MedusaTrainer:
    """The `MedusaTrainer` of the run's settings."""
    # Trainer's own pushes would upload the output folder, data caches included: the heads are uploaded apart.
    trainer_args = dataclasses.replace(training_args, push_to_hub=False) if training_args.push_to_hub else training_args
    return MedusaTrainer(
        model=model,
        args=trainer_args,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=MedusaCollator(tokenizer.pad_token_id),
        head_decay=config.head_decay,
        distill_weight=config.distill_weight,
        tree_nodes=config.tree_nodes,
        soft_targets=config.soft_targets,
        feature_weight=config.feature_weight,
        # Cached states were relabelled once, when they were computed.
        relabel_with_base=config.relabel_with_base and not config.cache_hidden_states,
    )


def _measure(trainer: MedusaTrainer, config: MedusaTrainingConfig, medusa_config: MedusaConfig) -> dict[str, float]:
    """Evaluate the trained heads on the held-out set (every process takes part: the counts are gathered) and
    keep what was measured in their config: top-1 and rank accuracies, the tree they pay for, expected tau."""
    metrics = trainer.evaluate()
    accuracy = rank_accuracies(metrics, medusa_config.num_heads)
    medusa_config.measured_top1 = [metrics[f"eval_head{k}_top1"] for k in range(medusa_config.num_heads)]
    medusa_config.measured_accuracy = [[round(a, 4) for a in head] for head in accuracy]
    if medusa_config.head_type not in ("eagle", "eagle3"):  # EAGLE heads grow their trees per row and step
        medusa_config.tree = [list(path) for path in build_tree(accuracy, config.tree_nodes).choices]
    medusa_config.extra.update(
        training_data=config.data,
        self_distilled=config.self_distill,
        soft_targets=config.soft_targets,
        expected_tau=round(metrics["eval_expected_tau"], 3),
        top5=[round(metrics[f"eval_head{k}_top5"], 3) for k in range(medusa_config.num_heads)],
    )
    return metrics


def _record_run(config: MedusaTrainingConfig, medusa_config: MedusaConfig, command: str | None) -> None:
    """Keep how the heads were trained in their config: the command, and the run's settings (the heads' shape
    as they are, a warm start's included)."""
    if command is not None:
        medusa_config.extra["training_command"] = command
    trained = asdict(config)
    trained.update({name: _head_shape(medusa_config, name) for name in _HEAD_SHAPE})
    medusa_config.extra["training_config"] = trained


def _publish(
    config: MedusaTrainingConfig,
    training_args: TrainingArguments,
    model: MedusaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    metrics: dict[str, float] | None,
) -> None:
    """From the main process: the metrics and tokenizer beside the saved heads, the engines' exports asked for,
    and the upload with `--push_to_hub`."""
    output_dir, medusa_config = Path(training_args.output_dir), model.config
    metrics_file = output_dir / METRICS_NAME
    if metrics is not None:
        metrics_file.write_text(json.dumps(metrics, indent=2))
        print(measured_summary(metrics, medusa_config.num_heads, config.base, output_dir))
    tokenizer.save_pretrained(output_dir)
    for engine in config.export_engines:
        export_heads(model, output_dir / "serving" / engine, engine, DTYPES[config.dtype], _served_base(config.base))
    if training_args.push_to_hub:
        model.push_to_hub(
            training_args.hub_model_id or output_dir.name,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
            revision=training_args.hub_revision,
            commit_message=f"{HEAD_NAMES[medusa_config.head_type]} trained with hf_specdec",
            extra_files=None if metrics is None else {METRICS_NAME: metrics_file},
        )


def measured_summary(metrics: dict[str, float], num_heads: int, base: str, output_dir: Path) -> str:
    """What a run measured on its held-out examples, and the command that benchmarks the heads it wrote."""
    top1 = " / ".join(f"{metrics[f'eval_head{k}_top1']:.3f}" for k in range(num_heads))
    top5 = " / ".join(f"{metrics[f'eval_head{k}_top5']:.3f}" for k in range(num_heads))
    return (
        f"Held-out accuracy by depth: top-1 {top1}; top-5 {top5}; expected tau {metrics['eval_expected_tau']:.2f}.\n"
        f"Benchmark the heads: hf-specdec bench --target {shlex.quote(base)} --draft none --medusa "
        f"{shlex.quote(str(output_dir))} --methods plain,medusa-16,medusa-16-lookup"
    )


def base_reference(base: str) -> str:
    """How heads' config names the base `--base` gave, so that `MedusaForCausalLM.from_pretrained` finds it again
    from any working folder: a zoo name as is (loaded through the zoo on any machine), a local folder as an
    absolute path, anything else (a Hub id) as is."""
    if base in ZOO or not Path(base).expanduser().is_dir():
        return base
    return str(Path(base).expanduser().absolute())


def _served_base(base: str) -> str:
    """The base as a serving engine loads it (TGI reads it from the exported config): `base_reference`, a zoo
    model named by its converted folder, which engines can read."""
    return engine_base_name(base_reference(base))


def _head_shape(config: MedusaConfig, name: str) -> Any:
    """The value of the training option `name` (one of `_HEAD_SHAPE`) that heads so configured were made with."""
    if name == "head_layer_type":
        return (config.layer_config or {}).get("model_type", "llama")
    return getattr(config, _CONFIG_NAME.get(name, name))


def _resume_argument(value: str | bool | None) -> str | bool | None:
    """`--resume_from_checkpoint true` resumes from the output folder's last checkpoint, as Trainer does for
    `True`; a path resumes from that checkpoint."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true" or None
    return value


def _split(
    config: MedusaTrainingConfig, training_args: TrainingArguments, parts: list[datasets.Dataset]
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """The training set and the held-out one: `eval_fraction` of each source's examples, or none."""
    if not config.eval_fraction:
        return datasets.concatenate_datasets(parts), None
    if small := [len(part) for part in parts if len(part) < 2]:
        raise ValueError(
            f"A data source has {small[0]} example(s): each source is split for evaluation on its own, so "
            "each needs at least 2 (merge small files into one source, or pass --eval_fraction 0)."
        )
    with training_args.main_process_first(desc="splitting"):
        splits = [part.train_test_split(test_size=config.eval_fraction, seed=training_args.seed) for part in parts]
    train = datasets.concatenate_datasets([split["train"] for split in splits])
    return train, datasets.concatenate_datasets([split["test"] for split in splits])


def source_records(config: MedusaTrainingConfig, data: str, max_examples: int | None) -> datasets.Dataset:
    """One data source's records as the run reads them (its split), the first `max_examples` when set."""
    records = load_records(data, split=config.dataset_split)
    if max_examples is not None:
        records = records.select(range(min(max_examples, len(records))))
    return records


def _tokenize_part(
    config: MedusaTrainingConfig,
    training_args: TrainingArguments,
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    output_dir: Path,
    layers: tuple[int, ...],
    role: str = "train",
    distill_kwargs: dict[str, Any] | None = None,
) -> datasets.Dataset:
    """One data source tokenised, self-distilled and with the base's hidden states of `layers` (concatenated), as
    configured; `role` `"eval"` keeps its self-distilled replies apart from the training data's and takes every
    record (`max_examples` caps training sources). Loading and tokenising run on the main process first (the others
    then read `datasets`' cache); self-distillation and the hidden states are split between the processes."""
    with training_args.main_process_first(desc="loading data"):
        records = source_records(config, source, config.max_examples if role == "train" else None)
    distilled_here = config.self_distill or (role == "eval" and config.eval_self_distill)
    if distilled_here and config.cache_hidden_states:
        # The base's hidden states come out of its own generation: no second forward over the replies.
        distilled = self_distill_with_states(
            base,
            tokenizer,
            records,
            output_dir / ("self_distill_states" if role == "train" else "eval_self_distill_states"),
            max_new_tokens=config.distill_max_new_tokens,
            batch_size=config.distill_batch_size,
            max_length=config.max_length,
            messages_column=config.messages_column,
            layers=layers,
        )
        # EAGLE heads read the prompt's tokens too; the other heads read the labelled ones only.
        return distilled if config.head_type in ("eagle", "eagle3") else distilled.remove_columns("input_ids")
    if distilled_here:
        records = self_distill(
            base,
            tokenizer,
            records,
            output_dir / ("self_distill.jsonl" if role == "train" else "eval_self_distill.jsonl"),
            max_new_tokens=config.distill_max_new_tokens,
            batch_size=config.distill_batch_size,
            messages_column=config.messages_column,
            generate_kwargs=distill_kwargs,
        )
    with training_args.main_process_first(desc="tokenizing"):
        tokenized = tokenize_records(
            records,
            tokenizer,
            config.max_length,
            messages_column=config.messages_column,
            text_column=config.text_column,
        )
    if not config.cache_hidden_states:
        return tokenized
    # The states (and relabelled labels) depend on the base and its dtype as well as on the data.
    base_id = hashlib.sha256(f"{base.name_or_path}|{base.dtype}".encode()).hexdigest()[:8]
    name = f"{tokenized._fingerprint}-{base_id}" + ("-relabeled" if config.relabel_with_base else "")
    if layers != (-1,):
        name += "-layers" + "_".join(map(str, layers))
    # input_ids stay: with relabelled labels they tell where the data follows the base's own path, and
    # recurrent heads read them.
    return cache_hidden_states(
        base,
        tokenized,
        output_dir / "hidden_states" / name,
        tokenizer.pad_token_id,
        relabel=config.relabel_with_base,
        layers=layers,
    )


def _fresh_model(config: MedusaTrainingConfig, base: PreTrainedModel, labels: list[list[int]]) -> MedusaForCausalLM:
    medusa_config = config.head_config()
    token_ids = None
    if config.head_vocab_size is not None:
        token_ids, coverage = _draft_vocabulary(labels, base, config.head_vocab_size)
        medusa_config.extra["head_vocab_coverage"] = round(coverage, 4)
    return MedusaForCausalLM.from_base(base, medusa_config, token_ids=token_ids)


def _warm_start(init_heads: str, base: PreTrainedModel) -> MedusaForCausalLM:
    """Trained heads on `base`, in float32 to train further. Their tree and accuracies stay until a new
    evaluation replaces them."""
    directory = local_directory(init_heads)
    if (directory / ADAPTER_FOLDER).exists():
        raise ValueError(
            f"--init_heads {init_heads} was trained with --lora: its base adapters change the base's hidden "
            "states. Train fresh heads, or merge the adapters into a copy of the base and pass that as --base."
        )
    model = MedusaForCausalLM.from_pretrained(directory, base_model=base, heads_dtype=torch.float32)
    model.config.extra = {"initialised_from": str(init_heads)}
    return model


def _draft_vocabulary(labels: list[list[int]], base: PreTrainedModel, size: int) -> tuple[torch.Tensor, float]:
    """The `size` most frequent label tokens (end-of-sequence ids always in), and the share of labels they hold."""
    counts = count_tokens(labels, output_vocab_size(base))
    token_ids = frequent_tokens(counts, size, eos_token_ids(base))
    return token_ids, _share(counts, token_ids)


def _coverage(labels: list[list[int]], base: PreTrainedModel, token_ids: torch.Tensor) -> float:
    """The share of labels that are among `token_ids`."""
    return _share(count_tokens(labels, output_vocab_size(base)), token_ids.cpu())


def _share(counts: torch.Tensor, token_ids: torch.Tensor) -> float:
    return float(counts[token_ids].sum() / counts.sum().clamp_min(1))
