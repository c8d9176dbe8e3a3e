"""`hf-specdec bench`: the benchmark from the command line."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import transformers

import hf_specdec
from hf_specdec.api.mixin import speculative
from hf_specdec.bench.cost_curve import verify_cost_curve
from hf_specdec.bench.markdown import command_line, machine
from hf_specdec.bench.methods import METHODS, NAMED_HEADS, PATTERNS, Method, heads_name, method_by_name, names_heads
from hf_specdec.bench.prompts import CATEGORIES, Prompt, load_prompts
from hf_specdec.bench.report import BenchmarkResult, format_table, write_outputs
from hf_specdec.bench.runner import run_benchmark
from hf_specdec.cli_args import (
    MODEL_DTYPE_HELP,
    MODEL_DTYPES,
    MODEL_HELP,
    HelpFormatter,
    check_pack_linears,
    device,
    heads_source,
    model_dtype,
    model_source,
    output_folder,
    positive_int,
    random_seed,
    require_zoo_converter,
)
from hf_specdec.cpu_linears import pack_linears
from hf_specdec.extras import require
from hf_specdec.machine import slow_bf16_warning
from hf_specdec.zoo import load_model

if TYPE_CHECKING:
    from hf_specdec.medusa import MedusaForCausalLM


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench` subcommand to an `hf-specdec` parser's subparsers."""
    bench = subparsers.add_parser(
        "bench",
        help="benchmark decoding methods on real models and prompts",
        description="Benchmark decoding methods on real models and prompts, interleaved batch by batch "
        "(docs/benchmarks.md); writes results.json and PNG plots into --out.",
        epilog=_patterns_help(),
        formatter_class=HelpFormatter,
    )
    bench.add_argument("--target", type=model_source, default="qwen2.5-coder-1.5b", help=MODEL_HELP)
    bench.add_argument(
        "--draft", type=_draft_source, default="qwen2.5-coder-0.5b", help=f"{MODEL_HELP}; none: no draft"
    )
    bench.add_argument(
        "--medusa",
        type=_heads_option,
        action="append",
        default=[],
        help="folder or Hub id (org/name) of heads for the target (any kind: Medusa, recurrent, EAGLE), which the "
        "medusa-... methods decode with; NAME=PATH names them, for the methods NAME-N, NAME-N-lookup, NAME-dynN and "
        "NAME-dynN-lookup: repeat the option to compare several heads in one run",
    )
    bench.add_argument(
        "--draft-vocab-size", type=positive_int, default=32768, help="draft vocabulary of specdec-vocab (ShareGPT's)"
    )
    bench.add_argument(
        "--prompts", type=_categories, default="mt-bench,humaneval,gsm8k", help=f"comma-separated: {sorted(CATEGORIES)}"
    )
    bench.add_argument("--n", type=positive_int, default=12, help="number of prompts")
    bench.add_argument("--batch-size", type=positive_int, default=1, help="prompts per generate() call")
    bench.add_argument("--max-new-tokens", type=positive_int, default=96, help="tokens to generate per prompt")
    bench.add_argument(
        "--methods",
        type=_method_names,
        default="plain,hf-assistant,hf-assistant-5h,specdec",
        help=f"comma-separated, plain first, from: {', '.join(sorted(METHODS))}; or by pattern (N, D, K: whole "
        f"numbers >= 1, see below): {', '.join(PATTERNS)}",
    )
    bench.add_argument("--do-sample", action="store_true", help="sample instead of greedy (no identity check)")
    bench.add_argument("--dtype", choices=MODEL_DTYPES, default="auto", help=MODEL_DTYPE_HELP)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    bench.add_argument(
        "--device",
        type=device,
        default=default_device,
        help="cpu, cuda, cuda:N or mps (default: cuda where torch sees one, else cpu; here %(default)s)",
    )
    bench.add_argument(
        "--pack-linears",
        action="store_true",
        help="run every model's float32 linear layers through oneDNN over packed weights (hf_specdec.pack_linears; "
        "CPU only), plain decoding's included",
    )
    bench.add_argument("--cost-curve", action="store_true", help="also time target forwards over 1..64 tokens")
    bench.add_argument(
        "--compile",
        action="store_true",
        help="every method with a static cache and its forwards compiled (transformers' CompileConfig; on a CPU "
        "without CUDA graphs); the warm-up compiles",
    )
    bench.add_argument("--seed", type=random_seed, default=0, help="seed of the prompt sample and of sampling")
    bench.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="run every method this many times per batch and time it by its median call (a noisy machine)",
    )
    bench.add_argument("--out", type=output_folder, default="bench_results", help="folder for results.json and plots")


def _patterns_help() -> str:
    """The methods named by pattern, one a line, with what each runs."""
    width = max(map(len, PATTERNS))
    return (
        "methods by pattern (N, D, K: whole numbers >= 1):\n"
        + "\n".join(f"  {pattern:<{width}}  {meaning}" for pattern, meaning in PATTERNS.items())
        + f"\nheads given a name (--medusa NAME=PATH) run as {NAMED_HEADS}."
    )


def _heads_option(text: str) -> tuple[str | None, str]:
    """`--medusa`: `PATH` (heads without a name: `(None, PATH)`) or `NAME=PATH`."""
    name, equals, source = text.partition("=")
    if not equals or "/" in name or not name or Path(text).is_dir():  # a folder's name may hold "="
        return None, heads_source(text)
    try:
        return heads_name(name), heads_source(source)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _draft_source(text: str) -> str | None:
    """`none` (no draft: `None`) or a model, as `model_source` takes it."""
    return None if text == "none" else model_source(text)


def _categories(text: str) -> list[str]:
    names = text.split(",")
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown prompt categories {unknown}; choose from {sorted(CATEGORIES)}")
    return names


def _method_names(text: str) -> list[str]:
    """`--methods`: the names, checked for what needs no other option (methods of named heads are resolved once
    `--medusa` is read: `methods`)."""
    names = text.split(",")
    if twice := _repeated(names):
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} listed twice in {text!r}")
    if names[0] != "plain":
        raise argparse.ArgumentTypeError(f"start with plain (the others are measured against it), got {text!r}")
    for name in names:
        try:
            method_by_name(name)
        except ValueError as error:
            if not names_heads(name):
                raise argparse.ArgumentTypeError(str(error)) from None
    return names


def _repeated(names: list[str]) -> list[str]:
    """The names listed more than once, sorted."""
    return sorted({name for name in names if names.count(name) > 1})


def methods(args: argparse.Namespace) -> list[Method]:
    """The `--methods` of a parsed `bench` command line, with the heads `--medusa` names.

    Raises:
        `ValueError`: for a method of heads that no `--medusa NAME=PATH` names.
    """
    return [method_by_name(name, heads=list(named_heads(args))) for name in args.methods]


def named_heads(args: argparse.Namespace) -> dict[str, str]:
    """The heads `--medusa NAME=PATH` names, by name."""
    return {name: source for name, source in args.medusa if name is not None}


def default_heads(args: argparse.Namespace) -> str | None:
    """The heads `--medusa PATH` gives without a name (`None`: none)."""
    return next((source for name, source in args.medusa if name is None), None)


def check_bench_args(args: argparse.Namespace) -> None:
    """Refuse, before any model loads, what the run would fail on: missing optional dependencies (matplotlib for
    the plots, gguf for a zoo model's first use, peft for heads with base adapters) and heads that are not there."""
    require("bench", "matplotlib", purpose="writing --out's plots")
    require_zoo_converter(args.target, args.draft)
    unnamed = [source for name, source in args.medusa if name is None]
    if len(unnamed) > 1:
        raise ValueError(f"--medusa gives {len(unnamed)} heads without a name: name them (--medusa NAME=PATH)")
    names = [name for name, _ in args.medusa if name is not None]
    if _repeated(names):
        raise ValueError(f"--medusa names two heads alike ({', '.join(names)}): give each its own name")
    args.resolved_methods = methods(args)
    if args.pack_linears:
        check_pack_linears(model_dtype(args.dtype, args.device), args.device, args.compile)
    for _, source in args.medusa:
        _check_heads(source, several=len(args.medusa) > 1)


def _check_heads(heads: str, several: bool = False) -> None:
    from hf_specdec.medusa.model import ADAPTER_FOLDER
    from hf_specdec.serving.cli import heads_config

    folder = Path(heads)
    if folder.is_dir():
        heads_config(folder, "--medusa")
        if (folder / ADAPTER_FOLDER).is_dir():
            if several:
                raise ValueError(
                    f"--medusa {heads}: heads trained with LoRA adapters merge them into the target, which the other "
                    "heads and methods would then run on: benchmark them alone (one --medusa)."
                )
            require("train", "peft", purpose=f"--medusa {heads} (heads trained with LoRA adapters on the base)")


def run_bench(args: argparse.Namespace) -> int:
    """Run `hf-specdec bench` on checked arguments; returns the exit status (1 if an output diverged beyond a
    bf16 tie)."""
    prompts = _prompts(args)  # before the models: a wrong --n fails in seconds
    dtype = model_dtype(args.dtype, args.device)
    if (slow := slow_bf16_warning(args.device, dtype)) is not None:
        print(f"hf-specdec bench: warning: {slow}", file=sys.stderr)
    target, tokenizer = load_model(args.target, dtype=dtype)
    target = speculative(target.to(args.device))
    draft = None if args.draft is None else load_model(args.draft, dtype=dtype)[0].to(args.device)
    medusa = None
    heads: dict[str, MedusaForCausalLM] = {}
    if args.medusa:
        from hf_specdec.medusa import MedusaForCausalLM

        if (source := default_heads(args)) is not None:
            medusa = MedusaForCausalLM.from_pretrained(source, base_model=target)
        for name, path in named_heads(args).items():
            heads[name] = MedusaForCausalLM.from_pretrained(path, base_model=target)
    if args.pack_linears:
        for model in (target, draft, medusa, *heads.values()):
            if model is not None:
                pack_linears(model)
    draft_vocab = None
    if any(method.needs_draft_vocab for method in args.resolved_methods):
        from hf_specdec.bench.vocabulary import sharegpt_draft_vocabulary

        draft_vocab = sharegpt_draft_vocabulary(tokenizer, args.draft_vocab_size)
    result = run_benchmark(
        target,
        tokenizer,
        prompts,
        args.resolved_methods,
        draft=draft,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        seed=args.seed,
        medusa=medusa,
        draft_vocab=draft_vocab,
        compile=args.compile,
        heads=heads,
        repeats=args.repeats,
    )
    result.settings.update(
        target=args.target,
        draft=args.draft or "none",
        medusa=default_heads(args),
        heads=named_heads(args),
        prompts=",".join(args.prompts),
        n=args.n,
        dtype=str(dtype).removeprefix("torch."),
        pack_linears=args.pack_linears,
        device=args.device,
        machine=machine(args.device),
        torch=torch.__version__,
        transformers=transformers.__version__,
        version=hf_specdec.__version__,
        date=datetime.date.today().isoformat(),
        command=command_line(),
    )
    if args.cost_curve:
        result.cost_curve = verify_cost_curve(target, batch_size=args.batch_size)
    return _report(result, args.out)


def _prompts(args: argparse.Namespace) -> list[Prompt]:
    try:
        return load_prompts(args.prompts, args.n, seed=args.seed)
    except ValueError as error:  # the categories and --n were checked: a sample larger than a category
        per_category = math.ceil(args.n / len(args.prompts))
        raise ValueError(
            f"--n {args.n} asks for {per_category} prompts from each of {','.join(args.prompts)}, more than one of "
            f"them holds ({error}): lower --n or add categories"
        ) from error


def _report(result: BenchmarkResult, out: Path) -> int:
    summary = result.summary()
    print(format_table(summary))
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}")
    for name, entry in summary.items():
        for d in entry.get("divergences", []):
            print(f"{name}: diverged from plain greedy at row {d['row']} token {d['position']}, logit gap {d['gap']}")
    files = write_outputs(result, out)
    print("wrote", ", ".join(str(f) for f in files))
    bad = sum(entry.get("divergences_beyond_tie", 0) for entry in summary.values())
    if bad:
        print(json.dumps({"divergences_beyond_tie": bad}))
    return 1 if bad else 0


# overhead -----------------------------------------------------------------------------------------------------


def add_overhead_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the `overhead` subcommand: host time per token and host reads per step, beside plain decoding."""
    from hf_specdec.bench.overhead import PATHS

    overhead = subparsers.add_parser(
        "overhead",
        help="host time per token and host reads per step of each path, beside plain generate()",
        description="What each speculative path costs the host beside plain greedy generate(), on tiny random "
        "Llamas whose forwards cost little: host time per generated token (wall time less the time inside model "
        "forwards) and host reads per step (each one a wait on a GPU). Prints a markdown table.",
        formatter_class=HelpFormatter,
    )
    overhead.add_argument(
        "--paths", type=_overhead_paths, default=",".join(PATHS), help=f"comma-separated, from {list(PATHS)}"
    )
    overhead.add_argument("--new-tokens", type=positive_int, default=256, help="tokens to generate per row")
    overhead.add_argument("--batch-size", type=positive_int, default=1, help="rows per generate() call")
    overhead.add_argument("--repeats", type=positive_int, default=5, help="timed calls per path (the median counts)")
    overhead.add_argument("--seed", type=random_seed, default=0, help="seed of the models and prompts")


def _overhead_paths(text: str) -> list[str]:
    from hf_specdec.bench.overhead import PATHS

    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in PATHS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown paths {unknown}; choose from {list(PATHS)}")
    return names


def check_overhead_args(args: argparse.Namespace) -> None:
    """Nothing beyond the argument types: the models are built from a config, nothing is downloaded."""


def run_overhead(args: argparse.Namespace) -> int:
    from hf_specdec.bench.overhead import format_overhead, measure_overhead

    torch.set_num_threads(1)  # tiny models: one thread is fastest and least noisy
    rows = measure_overhead(args.paths, args.new_tokens, args.batch_size, args.repeats, args.seed)
    print(format_overhead(rows))
    return 0
