"""Training Medusa heads: data rendering, the Trainer loop, hidden-state caching, LoRA, the recipe."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import datasets
import pytest
import safetensors.torch
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast, TrainingArguments

from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.medusa.loss import IGNORE_INDEX
from hf_specdec.training import (
    MedusaCollator,
    MedusaTrainer,
    MedusaTrainingConfig,
    cache_hidden_states,
    evaluate_heads,
    load_records,
    self_distill,
    self_distill_with_states,
    tokenize_conversation,
    tokenize_records,
)
from hf_specdec.training.data import to_messages
from hf_specdec.training.hidden_cache import base_labels
from hf_specdec.training.trainer import TOP_K
from tests.recipe import recipe_main
from tests.tiny_models import VOCAB, tiny_model

ROLES = ["user", "assistant", "system"]
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    words = [f"t{i}" for i in range(VOCAB - len(ROLES))] + ROLES
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="t2"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="t0", eos_token="t3")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def _conversations(n: int, seed: int = 0) -> list[dict]:
    """Conversations whose replies follow a rule the heads can learn: counting up from the prompt's token."""
    generator = torch.Generator().manual_seed(seed)
    records = []
    for _ in range(n):
        start = int(torch.randint(4, 40, (1,), generator=generator))
        reply = " ".join(f"t{start + i}" for i in range(1, 13))
        records.append({"conversations": [{"from": "human", "value": f"t{start}"}, {"from": "gpt", "value": reply}]})
    return records


def test_labels_cover_assistant_tokens_only() -> None:
    tokenizer = tiny_tokenizer()
    messages = [
        {"role": "user", "content": "t5 t6"},
        {"role": "assistant", "content": "t7 t8"},
        {"role": "user", "content": "t9"},
        {"role": "assistant", "content": "t10"},
    ]
    example = tokenize_conversation(tokenizer, messages, max_length=64)
    labelled = [tokenizer.convert_ids_to_tokens(t) for t in example["labels"] if t != IGNORE_INDEX]
    assert labelled == ["t7", "t8", "t10"]
    assert len(example["input_ids"]) == len(example["labels"])


def test_record_formats(tmp_path: Path) -> None:
    assert to_messages({"messages": [{"role": "user", "content": "x"}]}) == [{"role": "user", "content": "x"}]
    assert to_messages({"conversations": [{"from": "gpt", "value": "y"}]}) == [{"role": "assistant", "content": "y"}]
    assert to_messages({"text": "plain"}) is None
    with pytest.raises(ValueError, match="speaker"):
        to_messages({"conversations": [{"from": "robot", "value": "z"}]})
    with pytest.raises(ValueError, match="messages"):
        to_messages({"prompt": "?"})
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _conversations(3)))
    assert len(load_records(str(path))) == 3


def _trainer(tmp_path: Path, model: MedusaForCausalLM, data, soft_targets: bool = False, **overrides) -> MedusaTrainer:
    args = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        max_steps=40,
        report_to=[],
        save_strategy="no",
        logging_steps=10,
        remove_unused_columns=False,
    )
    args.update(overrides)
    return MedusaTrainer(
        model=model,
        args=TrainingArguments(**args),
        train_dataset=data,
        eval_dataset=data,
        data_collator=MedusaCollator(0),
        soft_targets=soft_targets,
    )


@pytest.fixture
def data():
    import datasets

    return tokenize_records(datasets.Dataset.from_list(_conversations(32)), tiny_tokenizer(), max_length=64)


@pytest.mark.parametrize("head_type", ["medusa", "recurrent", "eagle", "eagle3"])
def test_heads_learn_and_loss_falls(tmp_path: Path, data, head_type: str) -> None:
    base = tiny_model("llama", seed=0)
    config = MedusaConfig(num_heads=2, share_lm_head=False, head_type=head_type)
    model = MedusaForCausalLM.from_base(base, config).freeze_base()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    trainer = _trainer(tmp_path, model, data)
    first = trainer.evaluate()
    trainer.train()
    last = trainer.evaluate()
    assert last["eval_loss"] < 0.5 * first["eval_loss"]
    assert last["eval_head0_top1"] > first["eval_head0_top1"]
    assert last["eval_expected_tau"] > 1.5
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())  # Medusa-1: base frozen


@pytest.mark.parametrize("head_type", ["medusa", "recurrent"])
def test_soft_targets_teach_the_bases_own_choices(tmp_path: Path, data, head_type: str) -> None:
    """Heads taught the base's distributions (read off a relabelled hidden-state cache) come to guess the base's
    own choices, which is what the accuracies measure on relabelled data."""
    base = tiny_model("llama", seed=0, sharpen=4.0)
    relabelled = cache_hidden_states(base, data, tmp_path / "cache", pad_token_id=0, relabel=True)
    config = MedusaConfig(num_heads=2, share_lm_head=False, head_type=head_type)
    model = MedusaForCausalLM.from_base(base, config).freeze_base()
    trainer = _trainer(tmp_path, model, relabelled, soft_targets=True, max_steps=60)
    first = trainer.evaluate()
    trainer.train()
    last = trainer.evaluate()
    assert last["eval_loss"] < 0.5 * first["eval_loss"]
    # (Deeper heads: this random base rarely follows the data two tokens in a row, so they have no examples.)
    assert last["eval_head0_top1"] > first["eval_head0_top1"] + 0.5


@pytest.mark.parametrize("head_type", ["medusa", "eagle3"])
def test_relabelling_in_the_step_equals_the_relabelled_cache(tmp_path: Path, data, head_type: str) -> None:
    """`relabel_with_base` in the step (no cache: the labels become the base's choices, read off the states the
    step computes) gives the loss and the evaluation counts of a relabelled hidden-state cache."""
    base = tiny_model("llama", seed=0, sharpen=4.0)
    config = MedusaConfig(num_heads=2, share_lm_head=False, head_type=head_type)
    model = MedusaForCausalLM.from_base(base, config).freeze_base()
    layers = model.heads.state_layers if head_type == "eagle3" else (-1,)
    cached = cache_hidden_states(base, data, tmp_path / "cache", pad_token_id=0, relabel=True, layers=layers)
    collate = MedusaCollator(0)
    live_batch, cached_batch = collate([data[i] for i in range(4)]), collate([cached[i] for i in range(4)])
    assert not torch.equal(live_batch["labels"], cached_batch["labels"])  # the data's tokens are not the base's
    live = model(**live_batch, soft_targets=True, relabel_with_base=True, rank_top_k=3)
    from_cache = model(**cached_batch, soft_targets=True, rank_top_k=3)
    torch.testing.assert_close(live["loss"], from_cache["loss"], rtol=2e-3, atol=2e-3)  # float16 storage
    assert torch.equal(live["label_ranks"], from_cache["label_ranks"])


def test_states_in_the_step_skip_the_bases_logits(data) -> None:
    """Heads trained on states computed in the step never need the base's logits but at one position: its
    lm_head runs on one position per row (a fifth of SmolLM2's forward otherwise)."""
    base = tiny_model("llama", seed=0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, share_lm_head=False)).freeze_base()
    rows: list[int] = []
    base.lm_head.register_forward_hook(lambda _, inputs, __: rows.append(inputs[0].shape[-2]))
    batch = MedusaCollator(0)([data[i] for i in range(4)])
    model(**batch)
    assert rows == [1]


def test_cached_hidden_states_give_the_live_loss(tmp_path: Path, data) -> None:
    base = tiny_model("llama", seed=0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, share_lm_head=False)).freeze_base()
    cached = cache_hidden_states(base, data, tmp_path / "cache", pad_token_id=0).remove_columns("input_ids")
    collate = MedusaCollator(0)
    live_batch, cached_batch = collate([data[i] for i in range(4)]), collate([cached[i] for i in range(4)])
    trainer = _trainer(tmp_path, model, data)
    live = trainer.compute_loss(model, live_batch)
    from_cache = trainer.compute_loss(model, cached_batch)
    torch.testing.assert_close(from_cache, live, rtol=2e-3, atol=2e-3)  # float16 storage
    again = cache_hidden_states(base, data, tmp_path / "cache", pad_token_id=0)  # reloaded, not recomputed
    assert again._fingerprint == cached._fingerprint or len(again) == len(cached)


def test_medusa2_lora_trains_base_adapters_and_round_trips(tmp_path: Path, data) -> None:
    from peft import LoraConfig, get_peft_model

    base = tiny_model("llama", seed=0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, share_lm_head=False)).freeze_base()
    model.base = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    )
    assert model.base_trains
    trainer = _trainer(tmp_path, model, data, max_steps=3)
    trainer.train()
    model.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "base_adapter" / "adapter_config.json").exists()
    reloaded = MedusaForCausalLM.from_pretrained(tmp_path / "ckpt", base_model=tiny_model("llama", seed=0))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected = model.base(ids).logits
        got = reloaded.base(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)  # adapters merged into the base


@pytest.mark.parametrize("self_distilled", [False, True])
def test_recipe_end_to_end(tmp_path: Path, self_distilled: bool) -> None:
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(24)))
    main = recipe_main()
    out = tmp_path / "heads"
    main(
        [
            "--base", str(base_dir), "--data", str(data), "--num_heads", "2", "--share_lm_head", "false",
            "--cache_hidden_states", "--eval_fraction", "0.25", "--output_dir", str(out), "--max_steps", "5",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
            "--head_vocab_size", "40",
            # The self-distilled run also takes a bfloat16 base: its heads still train in float32.
            *(["--self_distill", "--distill_max_new_tokens", "12", "--dtype", "bfloat16"] if self_distilled else []),
        ]
    )  # fmt: skip
    assert (out / "self_distill_states").exists() == self_distilled
    saved = safetensors.torch.load_file(out / "medusa_heads.safetensors")
    assert saved["blocks.0.0.linear.weight"].dtype == torch.float32
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["num_heads"] == 2 and len(config["measured_top1"]) == 2 and config["tree"]
    assert len(config["measured_accuracy"]) == 2 and len(config["measured_accuracy"][0]) == TOP_K
    assert "expected_tau" in config["extra"]
    assert config["head_vocab_size"] == 40 and 0.0 < config["extra"]["head_vocab_coverage"] <= 1.0
    model = MedusaForCausalLM.from_pretrained(out)
    assert model.heads.token_ids.numel() == 40 and 3 in model.heads.token_ids.tolist()  # EOS always kept
    assert model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=5, medusa=True).shape == (1, 8)


def _base_with_train_and_eval_data(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A tiny base folder (with the tiny tokenizer), 16 training conversations and 6 others to evaluate on."""
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0, sharpen=4.0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in _conversations(16)))
    held_out.write_text("\n".join(json.dumps(r) for r in _conversations(6, seed=1)))
    return base_dir, train, held_out


def test_recipe_evaluates_on_eval_data_with_labels_from_the_base(tmp_path: Path) -> None:
    """`--eval_data` is the held-out set (nothing of `--data` is held out), and `--relabel_with_base` without a
    cache labels both in the step: the recipe's measurements are those of the saved heads on that set, labelled
    with the base's choices."""
    base_dir, train, held_out = _base_with_train_and_eval_data(tmp_path)
    tokenizer = tiny_tokenizer()
    out = tmp_path / "heads"
    recipe_main()(
        [
            "--base", str(base_dir), "--data", str(train), "--eval_data", str(held_out), "--relabel_with_base",
            "--soft_targets", "--num_heads", "2", "--share_lm_head", "false", "--output_dir", str(out),
            "--max_steps", "3", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
        ]
    )  # fmt: skip
    recorded = json.loads((out / "eval_metrics.json").read_text())
    model = MedusaForCausalLM.from_pretrained(out, base_model=tiny_model("llama", seed=0, sharpen=4.0)).freeze_base()
    evaluation = tokenize_records(load_records(str(held_out)), tokenizer, max_length=1024)
    measured = evaluate_heads(model, evaluation, tokenizer, relabel_with_base=True)
    assert recorded["eval_head0_top1"] == measured["eval_head0_top1"]
    assert recorded["eval_expected_tau"] == measured["eval_expected_tau"]
    # Against the data's own tokens, which this random base does not write, the heads are measured otherwise.
    assert evaluate_heads(model, evaluation, tokenizer)["eval_head0_top1"] != measured["eval_head0_top1"]


def test_recipe_evaluates_on_the_bases_own_replies_to_eval_data(tmp_path: Path) -> None:
    """`--eval_self_distill`: the base writes `--eval_data`'s replies (kept apart from the training data, which is
    not generated), and the recorded measurements are the heads' on those replies."""
    base_dir, train, held_out = _base_with_train_and_eval_data(tmp_path)
    tokenizer = tiny_tokenizer()
    out = tmp_path / "heads"
    recipe_main()(
        [
            "--base", str(base_dir), "--data", str(train), "--eval_data", str(held_out), "--eval_self_distill",
            "--distill_max_new_tokens", "10", "--relabel_with_base", "--num_heads", "2", "--share_lm_head", "false",
            "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to",
            "none", "--save_strategy", "no",
        ]
    )  # fmt: skip
    assert not (out / "self_distill.jsonl").exists()
    written = load_records(str(out / "eval_self_distill.jsonl"))
    data_reply = _conversations(6, seed=1)[0]["conversations"][1]["value"]
    assert len(written) == 6 and written[0]["messages"][-1]["content"] != data_reply  # the base's, not the data's
    model = MedusaForCausalLM.from_pretrained(out, base_model=tiny_model("llama", seed=0, sharpen=4.0))
    evaluation = tokenize_records(written, tokenizer, max_length=1024)
    measured = evaluate_heads(model, evaluation, tokenizer, relabel_with_base=True)  # as the run measures
    recorded = json.loads((out / "eval_metrics.json").read_text())
    assert recorded["eval_head0_top1"] == measured["eval_head0_top1"]


@pytest.mark.parametrize("mode", ["teacher-forced", "cached", "self-distilled", "self-distilled-drafted"])
def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, capsys, mode: str) -> None:
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(20)))
    out = tmp_path / "heads"
    distilled = ["--self_distill", "--distill_max_new_tokens", "6"]
    extra = {
        "cached": ["--cache_hidden_states"],
        "self-distilled": distilled,
        "self-distilled-drafted": [*distilled, "--distill_draft", str(base_dir), "--distill_prompt_lookup", "3"],
    }
    recipe_main()(
        [
            "--base", str(base_dir), "--data", str(data), "--num_heads", "2", "--head_type", "eagle3",
            "--head_vocab_size", "30", "--output_dir", str(out), "--num_train_epochs", "3",
            "--per_device_train_batch_size", "4", "--eval_fraction", "0.25", "--report_to", "none", "--dry_run",
            *extra.get(mode, []),
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    printed = captured.out
    assert "planning: timing a training step ..." in captured.err  # a line before each silent stage
    assert not out.exists()
    # 20 examples, 5 held out; 15 in batches of 4 are 4 steps an epoch, 3 epochs.
    assert "data: 20 examples" in printed and "15 to train on, 5 to evaluate on" in printed
    assert "training: 12 steps of 4 examples" in printed and "evaluation: 5 examples" in printed
    distilling = mode.startswith("self-distilled")
    assert ("self-distillation: 20 replies of up to 6 tokens" in printed) == distilling
    # Drafting is timed against plain generation on the same batch, and their replies compared (the draft is the
    # base itself: every reply the same).
    assert ("with drafting against" in printed and "8 of 8 replies the same" in printed) == (mode.endswith("drafted"))
    assert ("hidden states: cached once" in printed) == (mode == "cached")
    tokens = sum(len(row) for row in tokenize_records(load_records(str(data)), tokenizer, 1024)["input_ids"])
    assert (f"{tokens:,} tokens" in printed) == (not distilling)  # generated replies: an upper bound


def test_eval_data_and_a_held_out_share_are_refused_together() -> None:
    with pytest.raises(ValueError, match="--eval_data is the held-out set"):
        MedusaTrainingConfig(base="b", data="d.jsonl", eval_data="e.jsonl", eval_fraction=0.1)
    with pytest.raises(ValueError, match="--eval_self_distill self-distils --eval_data: add --eval_data"):
        MedusaTrainingConfig(base="b", data="d.jsonl", eval_self_distill=True)


def test_recipe_trains_eagle_heads_on_self_distilled_states(tmp_path: Path) -> None:
    """EAGLE heads read the prompt's tokens as well as the replies': the self-distilled cache keeps them."""
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(24)))
    main = recipe_main()
    out = tmp_path / "heads"
    main(
        [
            "--base", str(base_dir), "--data", str(data), "--num_heads", "3", "--head_type", "eagle",
            "--self_distill", "--distill_max_new_tokens", "12", "--cache_hidden_states", "--eval_fraction", "0.25",
            "--output_dir", str(out), "--max_steps", "4", "--per_device_train_batch_size", "4", "--report_to", "none",
            "--save_strategy", "no", "--head_vocab_size", "40", "--feature_weight", "0.5",
            "--head_intermediate_size", "24",
        ]
    )  # fmt: skip
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["head_type"] == "eagle" and len(config["measured_top1"]) == 3
    assert config["tree"] is None  # EAGLE heads grow their trees: no static one is written for them
    assert config["extra"]["training_config"]["feature_weight"] == 0.5 and config["intermediate_size"] == 24
    model = MedusaForCausalLM.from_pretrained(out)
    assert model.heads.decoder.config.intermediate_size == 24
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = model.base.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(input_ids=ids, max_new_tokens=8, do_sample=False, medusa=True), plain)
    with pytest.raises(ValueError, match="frozen base"):
        main(["--base", str(base_dir), "--data", str(data), "--head_type", "eagle", "--lora", "--output_dir", str(out)])


@pytest.mark.parametrize("self_distill", [True, False])
def test_recipe_trains_eagle3_heads_on_cached_fused_states(tmp_path: Path, self_distill: bool) -> None:
    """EAGLE-3 heads read three of the base's layers and learn from its last: the cache holds the four, whether
    it comes from self-distillation or from a forward over the data."""
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0, num_layers=4).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(24)))
    out = tmp_path / "heads"
    distill = ["--self_distill", "--distill_max_new_tokens", "12"] if self_distill else []
    recipe_main()(
        [
            "--base", str(base_dir), "--data", str(data), "--num_heads", "3", "--head_type", "eagle3", *distill,
            "--cache_hidden_states", "--eval_fraction", "0.25", "--output_dir", str(out), "--max_steps", "4",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
            "--head_vocab_size", "40", "--feature_layers", "1", "2", "3",
        ]
    )  # fmt: skip
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["head_type"] == "eagle3" and config["feature_layers"] == [1, 2, 3]
    assert config["share_lm_head"] is False and config["tree"] is None and len(config["measured_top1"]) == 3
    import datasets

    cache = "self_distill_states" if self_distill else "hidden_states"
    stored = datasets.load_from_disk(str(next((out / cache).rglob("dataset_info.json")).parent))
    assert len(stored[0]["hidden_states"][0]) == 4 * 64  # layers 1, 2, 3 and the last, 64 wide each
    model = MedusaForCausalLM.from_pretrained(out)
    assert model.heads.lm_head.weight.shape[0] == 40
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = model.base.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(input_ids=ids, max_new_tokens=8, do_sample=False, medusa=True), plain)


def test_recipe_caches_each_data_source_once(tmp_path: Path) -> None:
    """Adding a data source reuses the hidden states of the others; each source is split for evaluation on its
    own. Recurrent heads with soft targets on relabelled data, the recipe's setting for the best heads."""
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0, sharpen=4.0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(json.dumps(r) for r in _conversations(12, seed=1)))
    second.write_text("\n".join(json.dumps(r) for r in _conversations(8, seed=2)))
    main = recipe_main()
    out = tmp_path / "heads"

    def run(data: str) -> dict:
        main(
            [
                "--base", str(base_dir), "--data", data, "--num_heads", "2", "--head_type", "recurrent",
                "--cache_hidden_states", "--relabel_with_base", "--soft_targets", "--eval_fraction", "0.25",
                "--output_dir", str(out), "--max_steps", "3", "--per_device_train_batch_size", "4",
                "--report_to", "none", "--save_strategy", "no",
            ]
        )  # fmt: skip
        return {folder.name: folder.stat().st_mtime_ns for folder in (out / "hidden_states").iterdir()}

    alone = run(str(first))
    both = run(f"{first},{second}")
    assert len(alone) == 1 and len(both) == 2
    name = next(iter(alone))
    assert both[name] == alone[name]  # the first source's states were not computed again
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["extra"]["soft_targets"] and config["head_type"] == "recurrent"
    assert len(config["measured_top1"]) == 2
    single = tmp_path / "one.jsonl"
    single.write_text(json.dumps(_conversations(1)[0]))
    with pytest.raises(ValueError, match="at least 2"):
        run(f"{first},{single}")


def test_recipe_fine_tunes_trained_heads(tmp_path: Path) -> None:
    """--init_heads starts from saved heads (their float32 weights, architecture and vocabulary) instead of fresh
    ones, and measures them afresh; options that would change what a checkpoint fixes are refused, as are heads
    that need base adapters and paths that hold no heads."""
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0, sharpen=4.0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(12, seed=3)))
    main = recipe_main()
    common = [
        "--base", str(base_dir), "--data", str(data), "--cache_hidden_states", "--per_device_train_batch_size", "4",
        "--report_to", "none", "--save_strategy", "no",
    ]  # fmt: skip
    first, second = tmp_path / "first", tmp_path / "second"
    main([*common, "--output_dir", str(first), "--max_steps", "3", "--num_heads", "2", "--head_type", "recurrent",
          "--head_vocab_size", "40", "--learning_rate", "1e-2", "--eval_fraction", "0.25"])  # fmt: skip
    config_file = first / "medusa_config.json"
    stale = {**json.loads(config_file.read_text()), "measured_top1": [9.0, 9.0], "extra": {"marker": 1}}
    config_file.write_text(json.dumps(stale))

    def warm(*extra: str) -> dict:
        # No step size: the heads come out as they went in, to the bit, although the base is bfloat16.
        main([*common, "--output_dir", str(second), "--max_steps", "1", "--learning_rate", "0", "--dtype", "bfloat16",
              "--init_heads", str(first), *extra])  # fmt: skip
        before = safetensors.torch.load_file(first / "medusa_heads.safetensors")
        after = safetensors.torch.load_file(second / "medusa_heads.safetensors")
        assert before.keys() == after.keys()
        for name, tensor in before.items():
            assert torch.equal(after[name], tensor), name
        return json.loads((second / "medusa_config.json").read_text())

    config = warm("--eval_fraction", "0.25")
    assert config["head_type"] == "recurrent" and config["num_heads"] == 2 and config["head_vocab_size"] == 40
    assert config["base_model_name_or_path"] == str(base_dir)
    assert config["measured_top1"] != [9.0, 9.0] and len(config["measured_top1"]) == 2  # measured again
    extra = config["extra"]
    assert "marker" not in extra and extra["initialised_from"] == str(first) and "expected_tau" in extra
    assert 0.0 < extra["head_vocab_coverage"] <= 1.0
    assert extra["training_config"]["head_type"] == "recurrent" and extra["training_config"]["num_heads"] == 2
    unmeasured = warm("--eval_fraction", "0")
    assert unmeasured["measured_top1"] == [9.0, 9.0] and unmeasured["extra"]["measurements_from"] == str(first)

    with pytest.raises(ValueError, match="drop --num_heads, --head_vocab_size"):
        main([*common, "--output_dir", str(second), "--init_heads", str(first), "--num_heads", "3",
              "--head_vocab_size", "20"])  # fmt: skip
    with pytest.raises(ValueError, match="is not a folder"):
        main([*common, "--output_dir", str(second), "--init_heads", str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="no heads there"):
        main([*common, "--output_dir", str(second), "--init_heads", str(base_dir)])
    (first / "base_adapter").mkdir()
    with pytest.raises(ValueError, match="trained with --lora"):
        main([*common, "--output_dir", str(second), "--init_heads", str(first)])


def _refuse_generation(*args, **kwargs):
    raise AssertionError("a finished self-distillation must not generate again")


def test_self_distillation_writes_the_base_greedy_replies_and_resumes(tmp_path: Path, monkeypatch) -> None:
    base, tokenizer = tiny_model("llama", seed=0, sharpen=4.0), tiny_tokenizer()
    records = datasets.Dataset.from_list(_conversations(5))
    out = self_distill(base, tokenizer, records, tmp_path / "sd.jsonl", max_new_tokens=6, batch_size=2)
    assert len(out) == 5 and [m["role"] for m in out[0]["messages"]] == ["user", "assistant"]
    prompt = tokenizer.apply_chat_template(out[0]["messages"][:1], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    expected = base.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]
    assert out[0]["messages"][1]["content"] == tokenizer.decode(expected, skip_special_tokens=True).strip()
    monkeypatch.setattr(base, "generate", _refuse_generation)
    assert len(self_distill(base, tokenizer, records, tmp_path / "sd.jsonl", max_new_tokens=6, batch_size=2)) == 5


def test_self_distillation_through_speculative_decoding_writes_the_same_replies(tmp_path: Path, monkeypatch) -> None:
    base, tokenizer = tiny_model("llama", seed=0, sharpen=4.0), tiny_tokenizer()
    records = datasets.Dataset.from_list(_conversations(5))
    plain = self_distill(base, tokenizer, records, tmp_path / "plain.jsonl", max_new_tokens=12, batch_size=2)
    calls = []
    self_distill_module = importlib.import_module("hf_specdec.training.self_distill")  # the module, not the function
    speculative_generate = self_distill_module.speculative_generate

    def counting(model, **kwargs):
        calls.append(sorted(k for k in kwargs if k in ("assistant", "prompt_lookup_num_tokens")))
        return speculative_generate(model, **kwargs)

    monkeypatch.setattr(self_distill_module, "speculative_generate", counting)
    twin, other = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, sharpen=4.0)
    settings = [
        {"assistant": twin},
        {"assistant": other, "prompt_lookup_num_tokens": 3},
        {"prompt_lookup_num_tokens": 2},
    ]
    for index, kwargs in enumerate(settings):
        drafted = self_distill(
            base, tokenizer, records, tmp_path / f"drafted{index}.jsonl", max_new_tokens=12, batch_size=2,
            generate_kwargs=kwargs,
        )  # fmt: skip
        assert drafted.to_list() == plain.to_list(), kwargs
    assert len(calls) == 3 * 3  # every batch (3 of 2, 2, 1 prompts) of every setting drafted
    assert calls[:3] == [["assistant"]] * 3 and calls[3] == ["assistant", "prompt_lookup_num_tokens"]


def test_drafted_self_distillation_is_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ValueError, match="write self-distilled replies: add --self_distill"):
        MedusaTrainingConfig(base="b", data="d.jsonl", distill_draft="draft")
    with pytest.raises(ValueError, match="--cache_hidden_states keeps the states of a plain generation"):
        MedusaTrainingConfig(
            base="b", data="d.jsonl", self_distill=True, cache_hidden_states=True, distill_prompt_lookup=4
        )
    with pytest.raises(ValueError, match="drafts at least 1 token"):
        MedusaTrainingConfig(base="b", data="d.jsonl", self_distill=True, distill_prompt_lookup=0)


def test_self_distillation_keeps_the_hidden_states_a_forward_would_give(tmp_path: Path, monkeypatch) -> None:
    base, tokenizer = tiny_model("qwen2", seed=0, sharpen=4.0), tiny_tokenizer()
    records = datasets.Dataset.from_list(_conversations(5, seed=3))
    data = self_distill_with_states(base, tokenizer, records, tmp_path / "states", max_new_tokens=8, batch_size=3)
    assert len(data) == 5
    generated_lengths = set()
    for row in data:
        ids = torch.tensor(row["input_ids"])
        labels = torch.tensor(row["labels"])
        hidden = torch.tensor(row["hidden_states"])
        assert hidden.shape == (ids.numel(), base.config.hidden_size)
        reply = labels != IGNORE_INDEX
        assert torch.equal(labels[reply], ids[reply]) and not reply[0] and bool(reply[-1])
        generated_lengths.add(int(reply.sum()))
        with torch.no_grad():
            expected = base(ids[None], output_hidden_states=True).hidden_states[-1][0]
        # The generation's states (padded batch, step by step) are the teacher-forced ones, up to float16.
        torch.testing.assert_close(hidden[:-1], expected[:-1].half().float(), atol=2e-2, rtol=2e-2)
        assert not hidden[-1].any()
    assert min(generated_lengths) <= 8
    monkeypatch.setattr(base, "generate", _refuse_generation)
    again = self_distill_with_states(base, tokenizer, records, tmp_path / "states", max_new_tokens=8, batch_size=3)
    assert again["input_ids"] == data["input_ids"]


def test_self_distillation_batches_prompts_of_similar_length(tmp_path: Path, monkeypatch) -> None:
    base, tokenizer = tiny_model("llama", seed=0), tiny_tokenizer()
    words = [1, 30, 2, 25, 3, 20]  # corpus order alternates short and long openings
    records = datasets.Dataset.from_list(
        [{"messages": [{"role": "user", "content": " ".join(["word"] * n)}]} for n in words]
    )
    generate, widths = base.generate, []

    def recording(**kwargs):
        mask = kwargs["attention_mask"]
        widths.append((mask.shape[1], int((mask == 0).sum())))
        return generate(**kwargs)

    monkeypatch.setattr(base, "generate", recording)
    out = self_distill(base, tokenizer, records, tmp_path / "sd.jsonl", max_new_tokens=2, batch_size=2)
    assert out["id"] == list(range(6))  # every record once, given back in corpus order
    assert [w for w, _ in widths] == sorted((w for w, _ in widths), reverse=True)  # longest first
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in records]
    lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    # each batch pads only to its neighbour in length: 30+25 words, 20+3, 2+1 (in corpus order: 29+28+...)
    expected = sum(lengths[i + 1] - lengths[i] for i in range(0, 6, 2))
    assert sum(padding for _, padding in widths) == expected
    assert [len(m[0]["content"].split()) for m in out["messages"]] == words  # each reply with its own prompt
    widths.clear()
    data = self_distill_with_states(base, tokenizer, records, tmp_path / "states", max_new_tokens=2, batch_size=2)
    assert sum(padding for _, padding in widths) == expected
    prompt_lengths = [sum(label == IGNORE_INDEX for label in row) for row in data["labels"]]
    assert prompt_lengths == [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]  # corpus order


def test_base_labels_by_hand() -> None:
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 7, 8, 9]])
    predictions = torch.tensor([[1, 2, 3, 4, 5]])  # the base's argmax at each position: its next-token guess
    assert base_labels(labels, predictions).tolist() == [[IGNORE_INDEX, IGNORE_INDEX, 2, 3, 4]]


def test_relabeled_cache_holds_the_base_greedy_choices(tmp_path: Path, data) -> None:
    base = tiny_model("llama", seed=0, sharpen=4.0)
    cached = cache_hidden_states(base, data, tmp_path / "cache", pad_token_id=0, relabel=True)
    row = cached[0]
    ids = torch.tensor(row["input_ids"])[None]
    with torch.no_grad():
        greedy = base(ids).logits.argmax(dim=-1)[0]
    labels, original = torch.tensor(row["labels"]), torch.tensor(data[0]["labels"])
    keep = original != IGNORE_INDEX
    assert torch.equal(labels != IGNORE_INDEX, keep)
    assert torch.equal(labels[1:][keep[1:]], greedy[:-1][keep[1:]])
    assert not torch.equal(labels, original)  # a random tiny base does not write the data's replies
