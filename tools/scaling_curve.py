"""How acceptance grows with the data heads train on: every checkpoint of a training run, measured on one fixed
held-out set and in decoding, written as JSON and plotted.

For each checkpoint: the examples and tokens trained on (Trainer's state: `num_input_tokens_seen` with
`--include_num_input_tokens_seen non_padding`, else the examples seen times the run's mean tokens per example),
held-out top-1 accuracy by depth and expected tau (`hf_specdec.training.evaluate_heads`, labels the base's own
choices), and the tau greedy decoding reaches on the benchmark's prompts (tokens per target forward, the prefill
counted; `hf-specdec bench` measures speed and checks outputs). `hf-specdec simulate` turns acceptance into speedup.

    python tools/scaling_curve.py --base smollm2-135m --run heads/smollm2-curve --eval-data eval.jsonl \
        --train-data train.jsonl --steps 75,150,300,600 --out curve.json --plot curve.png --docs docs/training.md

`--docs` rewrites the page's table `--table NAME` (between `<!-- scaling-table NAME -->` and
`<!-- /scaling-table NAME -->`) from the points (`table`); points already in `--out` are not measured again, so a
rerun only renders.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import datasets
import torch

from hf_specdec import MedusaForCausalLM
from hf_specdec.bench.prompts import chat_inputs, load_prompts
from hf_specdec.bench.runner import row_lengths
from hf_specdec.training import evaluate_heads, load_records, self_distill, tokenize_records
from hf_specdec.zoo import load_model


def trained_on(checkpoint: Path, tokens_per_example: float) -> dict[str, float]:
    """Examples and tokens a checkpoint has trained on, from Trainer's state and arguments (a step is the batch
    of every process, times the gradient accumulation)."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    examples = state["global_step"] * state["train_batch_size"]
    if (saved := checkpoint / "training_args.bin").exists():
        args = torch.load(saved, weights_only=False)
        examples *= args.gradient_accumulation_steps * args.world_size
    tokens = state.get("num_input_tokens_seen") or examples * tokens_per_example
    if not tokens:
        raise SystemExit(f"{checkpoint} has no count of tokens seen: pass the run's data as --train-data.")
    return {"step": state["global_step"], "examples": examples, "tokens": int(tokens)}


def decoding_tau(model: MedusaForCausalLM, tokenizer: object, trees: list[int], n: int, max_new_tokens: int) -> dict:
    """Per tree size, the tau greedy decoding with these heads reaches on the benchmark's prompts (MT-Bench,
    HumanEval, GSM8K; `hf-specdec bench`'s sample): tokens per target forward, the prefill counted, and the
    acceptance by draft position."""
    prompts = load_prompts(["mt-bench", "humaneval", "gsm8k"], n)
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    result = {}
    for nodes in trees:
        tokens = forwards = 0
        drafted = accepted = None
        for prompt in prompts:
            inputs = chat_inputs(tokenizer, [prompt.text])  # type: ignore[arg-type]
            out = model.generate(
                **inputs, medusa=True, tree=nodes, max_new_tokens=max_new_tokens, do_sample=False,
                return_dict_in_generate=True,
            )  # fmt: skip
            tokens += row_lengths(out.sequences, inputs["input_ids"].shape[1], eos_ids)[0]
            stats = out.speculative
            forwards += int(stats.target_forwards[0]) + 1  # + the prefill
            drafted = stats.drafted_at_position if drafted is None else _add(drafted, stats.drafted_at_position)
            accepted = stats.accepted_at_position if accepted is None else _add(accepted, stats.accepted_at_position)
        by_position = [round(float(a) / float(d), 3) if d else None for a, d in zip(accepted, drafted, strict=True)]
        result[f"tree={nodes}"] = {"tau": round(tokens / forwards, 3), "acceptance_by_position": by_position[:6]}
    return result


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    width = max(a.numel(), b.numel())
    return torch.nn.functional.pad(a, (0, width - a.numel())) + torch.nn.functional.pad(b, (0, width - b.numel()))


def log_linear_fit(tokens: list[float], values: list[float]) -> tuple[float, float]:
    """`(a, b)` of the least-squares line `value = a + b * ln(tokens)`."""
    logs = [math.log(t) for t in tokens]
    mean_log, mean_value = sum(logs) / len(logs), sum(values) / len(values)
    spread = sum((x - mean_log) ** 2 for x in logs)
    slope = sum((x - mean_log) * (y - mean_value) for x, y in zip(logs, values, strict=True)) / spread
    return mean_value - slope * mean_log, slope


def plot(points: list[dict], path: Path, title: str, gpu_tokens: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    tokens = [p["tokens"] / 1e6 for p in points]
    depths = len(points[0]["held_out_top1"])
    for depth in range(depths):
        left.plot(tokens, [p["held_out_top1"][depth] for p in points], marker="o", label=f"depth {depth + 1}")
    left.set(xscale="log", xlabel="tokens trained on (millions)", ylabel="held-out top-1", title="accuracy by depth")
    left.xaxis.set_major_formatter(ScalarFormatter())
    left.xaxis.set_minor_formatter(NullFormatter())
    left.set_xticks(tokens, [f"{t:.2g}" for t in tokens])
    left.legend()
    for tree in points[0]["decoding"]:
        right.plot(tokens, [p["decoding"][tree]["tau"] for p in points], marker="o", label=f"decoding, {tree}")
    if len(points) >= 3:  # the first tree's decoding tau, extended on its log-linear fit to a GPU-scale run's data
        first = next(iter(points[0]["decoding"]))
        a, b = log_linear_fit([p["tokens"] for p in points], [p["decoding"][first]["tau"] for p in points])
        reach = a + b * math.log(gpu_tokens)
        label = f"log-linear fit, extended: {reach:.2f} at {gpu_tokens / 1e6:,.0f}M tokens"
        fitted = [a + b * math.log(points[0]["tokens"]), reach]
        right.plot([tokens[0], gpu_tokens / 1e6], fitted, linestyle=":", color="gray", label=label)
        right.axvline(gpu_tokens / 1e6, color="gray", linewidth=0.5)
    right.plot(tokens, [p["expected_tau"] for p in points], marker="s", linestyle="--", label="expected (16 nodes)")
    right.set(xscale="log", xlabel="tokens trained on (millions)", ylabel="tau (tokens per target forward)")
    right.set(title="tau")
    right.xaxis.set_major_formatter(ScalarFormatter())
    right.legend(loc="upper left", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markers(name: str) -> tuple[str, str]:
    """The comments around a docs page's scaling table `name` (a page may show the curves of several bases)."""
    return f"<!-- scaling-table {name} -->", f"<!-- /scaling-table {name} -->"


def table(points: list[dict]) -> str:
    """The docs' table of the points: one row per checkpoint (the first tree's decoding tau)."""
    depths = len(points[0]["held_out_top1"])
    tree = next(iter(points[0]["decoding"]))
    lines = [
        f"| checkpoint | examples | tokens | held-out top-1, depths {' / '.join(map(str, range(1, depths + 1)))} "
        f"| expected tau | decoding tau (`{tree}`) |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        top1 = " / ".join(f"{a:.3f}" for a in p["held_out_top1"])
        lines.append(
            f"| {p['step']} | {p['examples']:,} | {p['tokens'] / 1e6:.2f}M | {top1} | {p['expected_tau']:.2f} "
            f"| {p['decoding'][tree]['tau']:.2f} |"
        )
    return "\n".join(lines)


def rewrite_table(page: Path, name: str, points: list[dict]) -> None:
    """Replace the page's scaling table `name` (between its markers) with `table(points)`."""
    text = page.read_text()
    opening, closing = markers(name)
    if opening not in text or closing not in text:
        raise SystemExit(f"{page} has no table between {opening} and {closing}: add the two markers first.")
    start, end = text.index(opening) + len(opening), text.index(closing)
    page.write_text(text[:start] + "\n" + table(points) + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the heads' base (zoo name or folder)")
    parser.add_argument("--run", type=Path, required=True, help="the training run's output folder (checkpoint-N)")
    parser.add_argument("--steps", required=True, help="comma-separated checkpoint steps to measure")
    parser.add_argument("--eval-data", required=True, help="held-out data (the base's own replies, ideally)")
    parser.add_argument(
        "--eval-self-distill",
        action="store_true",
        help="the base writes the held-out requests' replies first (greedy, 128 new tokens; kept beside --out)",
    )
    parser.add_argument(
        "--train-data",
        help="the run's data, for its mean tokens per example (without a count; a run that cached self-distilled "
        "states counts its own examples)",
    )
    parser.add_argument("--max-length", type=int, default=512, help="the run's --max_length")
    parser.add_argument("--trees", default="16", help="comma-separated tree sizes to decode with")
    parser.add_argument("--n", type=int, default=12, help="benchmark prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, required=True, help="JSON file of the points")
    parser.add_argument("--plot", type=Path, help="PNG of the curve")
    parser.add_argument(
        "--gpu-tokens", type=float, default=1e8, help="tokens of a GPU-scale run, where the plot extends its fit"
    )
    parser.add_argument("--docs", type=Path, help="a docs page whose scaling table to rewrite from the points")
    parser.add_argument("--table", default="smollm2", help="which of the page's scaling tables (its markers' name)")
    args = parser.parse_args(argv)
    points = json.loads(args.out.read_text()) if args.out.exists() else []
    done = {p["step"] for p in points}
    todo = [int(s) for s in args.steps.split(",") if int(s) not in done]
    if todo:
        points = measure(args, todo, points)
    if args.plot is not None and points:
        title = f"EAGLE-3 heads for {args.base}: held-out and decoding acceptance against data"
        plot(points, args.plot, title, args.gpu_tokens)
    if args.docs is not None and points:
        rewrite_table(args.docs, args.table, points)
    return 0


def mean_example_tokens(run: Path, train_data: str | None, tokenizer: object, max_length: int) -> float:
    """The mean tokens of a run's examples: `train_data` tokenised, or the self-distilled examples a run with
    cached states keeps (the replies the base wrote); 0 when neither is there."""
    if train_data:
        train = tokenize_records(load_records(train_data), tokenizer, max_length)  # type: ignore[arg-type]
        return sum(len(ids) for ids in train["input_ids"]) / len(train)
    if shards := sorted((run / "self_distill_states").glob("*/shard-*")):
        lengths = [len(ids) for shard in shards for ids in datasets.load_from_disk(str(shard))["input_ids"]]
        return sum(lengths) / len(lengths)
    return 0.0


def measure(args: argparse.Namespace, steps: list[int], points: list[dict]) -> list[dict]:
    """Measure the checkpoints of `steps`, adding each point to `points` and to `args.out` as it is done."""
    base, tokenizer = load_model(args.base, dtype=torch.bfloat16)
    held_out = load_records(args.eval_data)
    if args.eval_self_distill:
        replies = args.out.with_name(f"{args.out.stem}-held-out-replies.jsonl")
        held_out = self_distill(base, tokenizer, held_out, replies, max_new_tokens=128, batch_size=len(held_out))
    evaluation = tokenize_records(held_out, tokenizer, args.max_length)
    per_example = mean_example_tokens(args.run, args.train_data, tokenizer, args.max_length)
    for step in steps:
        checkpoint = args.run / f"checkpoint-{step}"
        if (checkpoint / "base_adapter").exists():
            raise SystemExit(f"{checkpoint} trains the base through adapters: measure heads of a frozen base.")
        point = trained_on(checkpoint, per_example)
        model = MedusaForCausalLM.from_pretrained(checkpoint, base_model=base)
        metrics = evaluate_heads(model, evaluation, tokenizer, relabel_with_base=True)
        depths = model.config.num_heads
        point["held_out_top1"] = [round(metrics[f"eval_head{k}_top1"], 4) for k in range(depths)]
        point["expected_tau"] = round(metrics["eval_expected_tau"], 3)
        trees = [int(size) for size in args.trees.split(",")]
        point["decoding"] = decoding_tau(model, tokenizer, trees, args.n, args.max_new_tokens)
        print(json.dumps(point), flush=True)
        points = sorted([*points, point], key=lambda p: p["step"])
        args.out.write_text(json.dumps(points, indent=1))
    return points


if __name__ == "__main__":
    sys.exit(main())
