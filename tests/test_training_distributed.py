"""Training on two processes (torchrun, gloo, CPU): the heads are synchronised and equal to one process's with the
same global batch, evaluation is gathered, one process writes, and the data work is split between processes and
gives what one process gives.

The test launches this file as a script on two processes (`_worker`), then repeats the work on one process here
and compares. Tiny models, a few steps: about half a minute on two CPU cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import safetensors.torch
import torch
from transformers import TrainingArguments

from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.medusa.labels import IGNORE_INDEX
from hf_specdec.training import (
    MedusaCollator,
    MedusaTrainer,
    cache_hidden_states,
    self_distill,
    self_distill_with_states,
)
from tests.test_training import _conversations, tiny_tokenizer
from tests.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parent.parent
STEPS = 4
GLOBAL_BATCH = 8


def _counting(n: int, seed: int) -> datasets.Dataset:
    """Tokenised examples of one length, each a prompt and a reply counting up from it: every example has as
    many labelled positions, so the mean of the processes' mean losses is the mean over the global batch."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        start = int(torch.randint(4, 70, (1,), generator=generator))
        ids = [90, start, 91, *range(start + 1, start + 13)]
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * 3 + ids[3:]})
    return datasets.Dataset.from_list(rows)


def _train_data() -> datasets.Dataset:
    return _counting(16, seed=0)


def _eval_data() -> datasets.Dataset:
    # An odd count: the last batch of one process is padded with repeats, which the gathering must drop.
    return _counting(7, seed=5)


def _trainer(output_dir: Path, batch_size: int, head_type: str = "medusa", **overrides) -> MedusaTrainer:
    torch.manual_seed(1)
    config = MedusaConfig(num_heads=2, head_type=head_type, share_lm_head=False)
    model = MedusaForCausalLM.from_base(tiny_model("llama", seed=0), config).freeze_base()
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=2,
        learning_rate=1e-2,
        max_steps=STEPS,
        train_sampling_strategy="sequential",
        **{
            "report_to": [],
            "save_strategy": "no",
            "logging_steps": 100,
            "disable_tqdm": True,
            "remove_unused_columns": False,
            "use_cpu": True,
            **overrides,
        },
    )
    return MedusaTrainer(
        model=model,
        args=args,
        train_dataset=_train_data(),
        eval_dataset=_eval_data(),
        data_collator=MedusaCollator(0),
    )


def _heads(trainer: MedusaTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.medusa.heads.state_dict().items()}


def _records() -> datasets.Dataset:
    return datasets.Dataset.from_list(_conversations(5, seed=3))


def _worker(workdir: Path) -> None:
    """One of the two processes."""
    torch.set_num_threads(1)
    trainer = _trainer(workdir / "ddp", GLOBAL_BATCH // 2, ddp_backend="gloo")
    rank = trainer.args.process_index
    assert trainer.args.world_size == 2
    trainer.train()
    safetensors.torch.save_file(_heads(trainer), workdir / f"heads-rank{rank}.safetensors")
    metrics = trainer.evaluate()
    (workdir / f"metrics-rank{rank}.json").write_text(json.dumps(metrics))
    writes = []
    save = MedusaForCausalLM.save_pretrained

    def recording(self, directory, *args, **kwargs):
        writes.append(str(directory))
        return save(self, directory, *args, **kwargs)

    MedusaForCausalLM.save_pretrained = recording
    trainer.save_model(str(workdir / "saved"))
    (workdir / f"writes-rank{rank}.json").write_text(json.dumps(writes))

    base, tokenizer = tiny_model("llama", seed=0, sharpen=4.0), tiny_tokenizer()
    calls = []
    generate = base.generate

    def counting(**kwargs):
        calls.append(int(kwargs["input_ids"].shape[0]))
        return generate(**kwargs)

    base.generate = counting
    states = self_distill_with_states(base, tokenizer, _records(), workdir / "states", max_new_tokens=6, batch_size=2)
    jsonl = self_distill(base, tokenizer, _records(), workdir / "sd.jsonl", max_new_tokens=6, batch_size=2)
    cached = cache_hidden_states(base, _train_data(), workdir / "cache" / "tiny", pad_token_id=0, batch_size=3)
    summary = {
        "generated_rows": calls,
        "states": states.select_columns(["input_ids", "labels"]).to_dict(),
        "jsonl": jsonl.to_list(),
        "cached": len(cached),
    }
    (workdir / f"data-rank{rank}.json").write_text(json.dumps(summary))
    _recipe_worker(workdir, rank)


def _eagle3_worker(workdir: Path) -> None:
    """One of the two processes, with EAGLE-3 heads: the trainer, then the recipe (self-distillation keeping the
    four states EAGLE-3 trains on)."""
    torch.set_num_threads(1)
    trainer = _trainer(workdir / "ddp", GLOBAL_BATCH // 2, head_type="eagle3", ddp_backend="gloo")
    rank = trainer.args.process_index
    trainer.train()
    safetensors.torch.save_file(_heads(trainer), workdir / f"heads-rank{rank}.safetensors")
    _recipe_worker(workdir, rank, "--head_type", "eagle3", "--head_vocab_size", "64")


def _fsdp_on_cpu() -> None:
    """Lets accelerate turn FSDP on for CPU processes. It does so only for accelerators (GPUs and the like), but its
    FSDP2 code (the base's decoder layers sharded with `fully_shard`, the full state dict gathered to save) runs on
    gloo as on NCCL: with this, that code runs here as it does on GPUs."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def fsdp_init(self, *args, fsdp_plugin=None, **kwargs) -> None:
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = fsdp_init


FSDP = {
    "ddp_backend": "gloo",
    "fsdp": "full_shard",
    "fsdp_config": {
        "version": 2,
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        "state_dict_type": "FULL_STATE_DICT",
    },
}


def _fsdp_resume_worker(workdir: Path, head_type: str) -> None:
    """One of two processes under FSDP2: a run of 4 steps saving a checkpoint at step 2, then a fresh run resumed
    from that checkpoint to step 4."""
    torch.set_num_threads(1)
    _fsdp_on_cpu()
    straight = _trainer(workdir / "run", GLOBAL_BATCH // 2, head_type=head_type, save_strategy="steps", save_steps=2,
                        **FSDP)  # fmt: skip
    straight.train()
    straight.save_model(str(workdir / "straight"))
    resumed = _trainer(workdir / "run", GLOBAL_BATCH // 2, head_type=head_type, **FSDP)
    resumed.train(resume_from_checkpoint=str(workdir / "run" / "checkpoint-2"))
    resumed.save_model(str(workdir / "resumed"))


def _fsdp_worker(workdir: Path, head_type: str) -> None:
    """One of the two processes, the base sharded by FSDP2 (each process holds half of every decoder layer)."""
    torch.set_num_threads(1)
    _fsdp_on_cpu()
    trainer = _trainer(workdir / "fsdp", GLOBAL_BATCH // 2, head_type=head_type, **FSDP)
    trainer.train()
    rank = trainer.args.process_index
    weight = trainer.medusa.base.model.layers[0].mlp.gate_proj.weight
    shards = {"sharded": trainer.is_fsdp_enabled and hasattr(weight, "to_local"), "shape": list(weight.shape)}
    if shards["sharded"]:
        shards["local"] = list(weight.to_local().shape)
    (workdir / f"shards-rank{rank}.json").write_text(json.dumps(shards))
    trainer.save_model(str(workdir / "saved"))


def _recipe_worker(workdir: Path, rank: int, *extra: str) -> None:
    """The recipe end to end with self-distillation, hidden states and an upload (recorded, not sent)."""
    from huggingface_hub import CommitInfo, HfApi, RepoUrl

    sys.path.insert(0, str(ROOT / "recipes"))
    from train_medusa import main

    pushes = []

    def create_repo(api, repo_id, **kwargs):
        pushes.append(["repo", repo_id])
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(api, repo_id, operations, **kwargs):
        pushes.append(["commit", sorted(operation.path_in_repo for operation in operations)])
        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message="", commit_description="", oid="0"
        )

    HfApi.create_repo, HfApi.create_commit = create_repo, create_commit
    main(
        [
            "--base", str(workdir / "base"), "--data", str(workdir / "conversations.jsonl"), "--num_heads", "2",
            "--self_distill", "--distill_max_new_tokens", "6", "--distill_batch_size", "2", "--cache_hidden_states",
            "--eval_fraction", "0.25", "--output_dir", str(workdir / "recipe"), "--max_steps", "2",
            "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no",
            "--use_cpu", "--ddp_backend", "gloo", "--push_to_hub", "--hub_model_id", "org/heads", *extra,
        ]
    )  # fmt: skip
    (workdir / f"pushes-rank{rank}.json").write_text(json.dumps(pushes))


def _launch(tmp_path: Path, *args: str) -> None:
    """Runs this file's worker on two processes over `tmp_path` (a tiny base and conversations written there)."""
    tiny_model("llama", seed=0, sharpen=4.0).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    (tmp_path / "conversations.jsonl").write_text("\n".join(json.dumps(r) for r in _conversations(9, seed=4)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*launch, str(Path(__file__).resolve()), str(tmp_path), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _same_heads_as_one_process(tmp_path: Path, head_type: str) -> MedusaTrainer:
    """The heads are identical on both processes, and what one process makes of the same global batches."""
    ranks = [safetensors.torch.load_file(tmp_path / f"heads-rank{r}.safetensors") for r in range(2)]
    single = _trainer(tmp_path / "single", GLOBAL_BATCH, head_type=head_type)
    start = _heads(single)
    single.train()
    alone = _heads(single)
    for name, tensor in alone.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name
        torch.testing.assert_close(ranks[0][name], tensor, rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(alone[name], start[name]) for name in alone)  # the heads did move
    return single


def test_two_processes_train_the_same_heads_as_one_and_split_the_data_work(tmp_path: Path) -> None:
    _launch(tmp_path)
    single = _same_heads_as_one_process(tmp_path, "medusa")

    # Evaluation: Trainer's loop gathered both processes' counts, without the repeats that padded the last batch.
    metrics = [json.loads((tmp_path / f"metrics-rank{r}.json").read_text()) for r in range(2)]
    reference = single.evaluate()
    accuracies = [k for k in reference if "_head" in k or k.endswith("expected_tau")]
    assert len(accuracies) == 2 * 10 + 1
    for key in accuracies:
        assert metrics[0][key] == metrics[1][key], key
        assert abs(metrics[0][key] - reference[key]) < 1e-6, key

    # One process wrote the checkpoint.
    writes = [json.loads((tmp_path / f"writes-rank{r}.json").read_text()) for r in range(2)]
    assert len(writes[0]) == 1 and writes[1] == []
    assert (tmp_path / "saved" / "medusa_heads.safetensors").exists()

    # Self-distillation: the batches were split (3 batches of 2, 2, 1 rows), and the records are one process's.
    data = [json.loads((tmp_path / f"data-rank{r}.json").read_text()) for r in range(2)]
    rows = [sum(r["generated_rows"]) for r in data]
    assert sum(rows) == 2 * 5 and min(rows) > 0  # two self-distillations of 5 records, each split
    assert data[0]["states"] == data[1]["states"] and data[0]["jsonl"] == data[1]["jsonl"]
    base, tokenizer = tiny_model("llama", seed=0, sharpen=4.0), tiny_tokenizer()
    states = self_distill_with_states(base, tokenizer, _records(), tmp_path / "one", max_new_tokens=6, batch_size=2)
    assert data[0]["states"] == states.select_columns(["input_ids", "labels"]).to_dict()
    jsonl = self_distill(base, tokenizer, _records(), tmp_path / "one.jsonl", max_new_tokens=6, batch_size=2)
    assert data[0]["jsonl"] == jsonl.to_list()
    assert sorted(p.name for p in tmp_path.glob("sd.rank*.jsonl")) == ["sd.rank0.jsonl", "sd.rank1.jsonl"]

    # The hidden-state cache: computed in two shards, joined into one folder, equal to one process's.
    joined = datasets.load_from_disk(str(tmp_path / "cache" / "tiny"))
    assert data[0]["cached"] == data[1]["cached"] == len(joined) == 16
    assert not list((tmp_path / "cache").glob("tiny.part*"))
    one = cache_hidden_states(base, _train_data(), tmp_path / "cache-one", pad_token_id=0, batch_size=3)
    assert joined.select_columns("input_ids").to_dict() == one.select_columns("input_ids").to_dict()
    for a, b in zip(joined.to_dict()["hidden_states"], one.to_dict()["hidden_states"], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=2e-3, rtol=2e-3)

    # The recipe: one upload, from the main process; self-distillation in 5 batches of 2 prompts, split.
    pushes = [json.loads((tmp_path / f"pushes-rank{r}.json").read_text()) for r in range(2)]
    files = ["README.md", "eval_metrics.json", "medusa_config.json", "medusa_heads.safetensors"]
    assert pushes == [[["repo", "org/heads"], ["commit", files]], []]
    shards = list((tmp_path / "recipe" / "self_distill_states").glob("*/shard-*"))
    assert len(shards) == 5
    assert json.loads((tmp_path / "recipe" / "medusa_config.json").read_text())["measured_top1"]


def test_two_processes_train_the_same_eagle3_heads_as_one(tmp_path: Path) -> None:
    _launch(tmp_path, "eagle3")
    _same_heads_as_one_process(tmp_path, "eagle3")
    pushes = [json.loads((tmp_path / f"pushes-rank{r}.json").read_text()) for r in range(2)]
    assert len(pushes[0]) == 2 and pushes[1] == []
    config = json.loads((tmp_path / "recipe" / "medusa_config.json").read_text())
    assert config["head_type"] == "eagle3" and config["measured_top1"]
    assert len(list((tmp_path / "recipe" / "self_distill_states").glob("*/shard-*"))) == 5


@pytest.mark.parametrize("head_type", ["medusa", "eagle3"])
def test_two_processes_with_the_base_sharded_train_the_same_heads_as_one(tmp_path: Path, head_type: str) -> None:
    _launch(tmp_path, "fsdp", head_type)
    for rank in range(2):  # every decoder layer of the base was split between the processes
        shards = json.loads((tmp_path / f"shards-rank{rank}.json").read_text())
        assert shards["sharded"] and shards["local"][0] * 2 == shards["shape"][0], shards
    saved = safetensors.torch.load_file(tmp_path / "saved" / "medusa_heads.safetensors")
    single = _trainer(tmp_path / "single", GLOBAL_BATCH, head_type=head_type)
    single.train()
    alone = _heads(single)
    assert saved.keys() == alone.keys()
    for name, tensor in alone.items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_type", ["medusa", "eagle3"])
def test_training_with_the_base_sharded_resumes_where_it_stopped(tmp_path: Path, head_type: str) -> None:
    _launch(tmp_path, "fsdp-resume", head_type)
    straight = safetensors.torch.load_file(tmp_path / "straight" / "medusa_heads.safetensors")
    resumed = safetensors.torch.load_file(tmp_path / "resumed" / "medusa_heads.safetensors")
    at_step_2 = safetensors.torch.load_file(tmp_path / "run" / "checkpoint-2" / "medusa_heads.safetensors")
    assert straight.keys() == resumed.keys()
    assert any(not torch.equal(at_step_2[name], straight[name]) for name in straight)  # steps 3 and 4 trained
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    if sys.argv[2:3] == ["fsdp"]:
        _fsdp_worker(Path(sys.argv[1]), sys.argv[3])
    elif sys.argv[2:3] == ["fsdp-resume"]:
        _fsdp_resume_worker(Path(sys.argv[1]), sys.argv[3])
    elif sys.argv[2:] == ["eagle3"]:
        _eagle3_worker(Path(sys.argv[1]))
    else:
        _worker(Path(sys.argv[1]))
    # Both ranks leave together, once each has written its results, and skip the interpreter's teardown: gloo's
    # threads (with FSDP2 on CPU processes, which only these tests run) can abort a rank while they are torn down on
    # a loaded machine ("terminate called without an active exception"), after the work is done.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
