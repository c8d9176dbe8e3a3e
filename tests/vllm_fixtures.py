"""What the vLLM tests share (`tests/test_vllm_*.py`, run with `-m vllm`): vLLM's own virtual environment, and heads
for SmolLM2-135M trained with the recipe's pipeline on MT-bench questions, cached under `$HF_SPECDEC_CACHE/heads/`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-vllm"
TRAIN_PROMPTS, EVAL_PROMPTS = 72, 8  # the first questions train the heads, the others are served


def one_torch_thread() -> Iterator[None]:
    """One torch thread on this side while a test runs: beside vLLM on a 2-core machine, two threads spin against
    each other (plain greedy on SmolLM2 measured 113 s with two, 4.6 s with one, for the same 64 tokens)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def vllm_python() -> Path:
    """The Python of `.venv-vllm`, made first when missing (tools/make_vllm_venv.sh)."""
    subprocess.run(["bash", str(ROOT / "tools" / "make_vllm_venv.sh"), str(VENV)], check=True)
    return VENV / "bin" / "python"


def smollm2_heads(name: str, heads: dict[str, Any], num_train_epochs: int, learning_rate: float) -> Path:
    """Heads for SmolLM2-135M (`heads`: the `MedusaTrainingConfig` fields of their kind) trained on self-distilled
    replies to `TRAIN_PROMPTS` MT-bench questions, in float32; trained once, then read from the cache folder `name`."""
    from transformers import TrainingArguments

    from hf_specdec.bench.prompts import load_prompts
    from hf_specdec.training import MedusaTrainingConfig, train_medusa
    from hf_specdec.zoo import cache_dir

    out = cache_dir() / "heads" / name
    if (out / "medusa_heads.safetensors").exists():
        return out
    work = out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    data = work / "questions.jsonl"
    questions = load_prompts(["mt-bench"], TRAIN_PROMPTS + EVAL_PROMPTS, seed=0)[:TRAIN_PROMPTS]
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q.text}]}) + "\n" for q in questions))
    config = MedusaTrainingConfig(
        base="smollm2-135m",
        data=str(data),
        self_distill=True,
        cache_hidden_states=True,
        distill_max_new_tokens=96,
        distill_batch_size=16,
        max_length=384,
        eval_fraction=0.1,
        **heads,
    )
    arguments = TrainingArguments(
        output_dir=str(work / "heads"),
        num_train_epochs=num_train_epochs,
        per_device_train_batch_size=8,
        learning_rate=learning_rate,
        warmup_steps=5,
        lr_scheduler_type="cosine",
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    train_medusa(config, arguments)
    (work / "heads").rename(out)
    return out
