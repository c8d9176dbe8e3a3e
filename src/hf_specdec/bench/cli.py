"""`hf-specdec bench`: the benchmark from the command line."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from hf_specdec.bench.cost_curve import verify_cost_curve
from hf_specdec.bench.methods import METHODS, method_by_name
from hf_specdec.bench.prompts import CATEGORIES, load_prompts
from hf_specdec.bench.report import format_table, write_outputs
from hf_specdec.bench.runner import run_benchmark
from hf_specdec.generation.mixin import speculative
from hf_specdec.zoo import load_model

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmark decoding methods on real models and prompts")
    bench.add_argument("--target", default="qwen2.5-coder-1.5b", help="zoo name, local folder or Hub id")
    bench.add_argument("--draft", default="qwen2.5-coder-0.5b", help="zoo name, folder or Hub id; 'none' for no draft")
    bench.add_argument("--medusa", default=None, help="folder or Hub id of Medusa heads for the target")
    bench.add_argument(
        "--draft-vocab-size", type=int, default=32768, help="draft vocabulary of specdec-vocab (ShareGPT's top tokens)"
    )
    bench.add_argument("--prompts", default="mt-bench,humaneval,gsm8k", help=f"comma-separated: {sorted(CATEGORIES)}")
    bench.add_argument("--n", type=int, default=12, help="number of prompts")
    bench.add_argument("--batch-size", type=int, default=1)
    bench.add_argument("--max-new-tokens", type=int, default=96)
    bench.add_argument(
        "--methods",
        default="plain,hf-assistant,hf-assistant-5h,specdec",
        help=f"{sorted(METHODS)}, or medusa-N / medusa-dynN[-lookup] for Medusa trees of N nodes",
    )
    bench.add_argument("--do-sample", action="store_true", help="sample instead of greedy (no identity check)")
    bench.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    bench.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    bench.add_argument("--cost-curve", action="store_true", help="also time target forwards over 1..64 tokens")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", type=Path, default=Path("bench_results"), help="folder for results.json and plots")


def run_bench(args: argparse.Namespace) -> int:
    methods = [method_by_name(name) for name in args.methods.split(",")]
    dtype = DTYPES[args.dtype]
    target, tokenizer = load_model(args.target, dtype=dtype)
    target = speculative(target.to(args.device))
    draft = None if args.draft == "none" else load_model(args.draft, dtype=dtype)[0].to(args.device)
    medusa = None
    if args.medusa:
        from hf_specdec.medusa import MedusaForCausalLM

        medusa = MedusaForCausalLM.from_pretrained(args.medusa, base_model=target)
    prompts = load_prompts(args.prompts.split(","), args.n, seed=args.seed)
    draft_vocab = None
    if any(method.needs_draft_vocab for method in methods):
        from hf_specdec.bench.vocabulary import sharegpt_draft_vocabulary

        draft_vocab = sharegpt_draft_vocabulary(tokenizer, args.draft_vocab_size)
    result = run_benchmark(
        target,
        tokenizer,
        prompts,
        methods,
        draft=draft,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        seed=args.seed,
        medusa=medusa,
        draft_vocab=draft_vocab,
    )
    result.settings.update(
        target=args.target,
        draft=args.draft,
        medusa=args.medusa,
        prompts=args.prompts,
        n=args.n,
        dtype=args.dtype,
        device=args.device,
        machine=f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        torch=torch.__version__,
    )
    if args.cost_curve:
        result.cost_curve = verify_cost_curve(target, batch_size=args.batch_size)
    summary = result.summary()
    print(format_table(summary))
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}")
    for name, entry in summary.items():
        for d in entry.get("divergences", []):
            print(f"{name}: diverged from plain greedy at row {d['row']} token {d['position']}, logit gap {d['gap']}")
    files = write_outputs(result, args.out)
    print("wrote", ", ".join(str(f) for f in files))
    bad = sum(entry.get("divergences_beyond_tie", 0) for entry in summary.values())
    if bad:
        print(json.dumps({"divergences_beyond_tie": bad}))
    return 1 if bad else 0
