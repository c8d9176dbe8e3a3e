"""The `hf-specdec` command line: `demo`, `bench`, `overhead`, `gpu`, `simulate`, `data` and `export`.

Every subcommand refuses bad input before any work starts: argument types (below) refuse malformed and
out-of-range values and paths that cannot be used, and each subcommand's check, run right after parsing, refuses
conflicting options and missing optional dependencies, naming the extra to install. What a user can still get
wrong surfaces as a `ValueError`, a `TypeError` or an `OSError` about a path, and `main` reports all of them the
same way: one line on stderr, `hf-specdec <command>: error: <what was wrong and what to do>`, and exit status 2.
Any other exception is a bug, and keeps its traceback.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hf_specdec.bench import cli as bench
from hf_specdec.bench import gpu_cli as gpu
from hf_specdec.cli_args import (
    MODEL_DTYPE_HELP,
    MODEL_DTYPES,
    MODEL_HELP,
    USER_ERRORS,
    ArgumentParser,
    HelpFormatter,
    check_pack_linears,
    model_dtype,
    model_source,
    non_empty,
    non_negative_int,
    one_line,
    output_file,
    positive_int,
    require_zoo_converter,
    share,
)
from hf_specdec.code_corpus import MIN_CHUNK_CHARS, code_records, python_roots
from hf_specdec.cpu_linears import packs_by_default
from hf_specdec.serving import cli as serving
from hf_specdec.simulator import cli as simulator
from hf_specdec.topics import TOPICS, select_conversations

# demo ---------------------------------------------------------------------------------------------------------


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="plain generate() and generate(assistant=...) side by side",
        description=(
            "Plain generate() and generate(assistant=...) side by side on real models, greedy.\n"
            "Prints the prompts and the settings, then each path's text and time (after a warm-up of both\n"
            "models, the median of 3 timed runs), the speedup, and the speculative steps: how many target\n"
            "forwards drafted and how many were plain, and the share of drafted tokens accepted."
        ),
        formatter_class=HelpFormatter,
    )
    demo.add_argument("--target", type=model_source, default="qwen2.5-coder-1.5b", help=MODEL_HELP)
    demo.add_argument("--draft", type=model_source, default="qwen2.5-coder-0.5b", help=MODEL_HELP)
    demo.add_argument("--prompt", type=non_empty, action="append", help="a prompt (repeat for a batch); default: one")
    demo.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate per prompt")
    demo.add_argument("--num-assistant-tokens", type=positive_int, help="tokens drafted per step (at most)")
    demo.add_argument("--dtype", choices=MODEL_DTYPES, default="auto", help=MODEL_DTYPE_HELP)
    demo.add_argument(
        "--pack-linears",
        action=argparse.BooleanOptionalAction,
        help="run both models' linear layers through oneDNN over packed weights (hf_specdec.pack_linears; faster "
        "plain and speculative decoding on a CPU, about twice the memory for those layers); default: in float32 on "
        "an x86 CPU",
    )


def _check_demo(args: argparse.Namespace) -> None:
    require_zoo_converter(args.target, args.draft)
    if args.pack_linears:
        check_pack_linears(model_dtype(args.dtype, "cpu"), "cpu")


def _run_demo(args: argparse.Namespace) -> int:
    from hf_specdec.bench import demo

    prompts = args.prompt or demo.DEFAULT_PROMPTS
    dtype = model_dtype(args.dtype, "cpu")  # the demo runs on the CPU
    pack = args.pack_linears if args.pack_linears is not None else dtype == torch.float32 and packs_by_default()
    passed = demo.run_demo(
        args.target, args.draft, prompts, args.max_new_tokens, dtype, args.num_assistant_tokens, pack_linears=pack
    )
    return 0 if passed else 1


# data ---------------------------------------------------------------------------------------------------------


def _add_data_parser(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser(
        "data",
        help="export training data as JSONL: ShareGPT V3 conversations (from its PyPI wheel) or Python code",
        description="Export training data as JSONL: ShareGPT V3 conversations (from its PyPI wheel), cut to their "
        "first exchange unless --whole, or (--source python) the Python files of this environment's packages and "
        "standard library, in chunks, as plain text records for teacher-forced training.",
        formatter_class=HelpFormatter,
    )
    data.add_argument(
        "--source", choices=("sharegpt", "python"), default="sharegpt", help="ShareGPT V3, or installed Python code"
    )
    data.add_argument("--n", type=positive_int, default=1000, help="conversations (or code chunks) to export")
    data.add_argument("--whole", action="store_true", help="keep whole conversations, not their first exchange")
    data.add_argument(
        "--max-chars", type=positive_int, help="--source python: characters per chunk, at most (default: 2000)"
    )
    data.add_argument("--max-prompt-chars", type=non_negative_int, default=1000, help="skip openings longer")
    data.add_argument("--min-prompt-chars", type=non_negative_int, default=0, help="skip openings shorter")
    data.add_argument(
        "--skip", type=non_negative_int, default=0, help="skip this many conversations (or code chunks) first"
    )
    data.add_argument(
        "--topic",
        action="append",
        choices=TOPICS,
        help="keep only requests about this topic, other: neither (repeat for several; see hf_specdec.topics)",
    )
    data.add_argument("--min-ascii", type=share, default=0.0, help="skip openings with a smaller share of ASCII")
    data.add_argument("--out", type=output_file, required=True, help="the JSONL file to write")


def _check_data(args: argparse.Namespace) -> None:
    if args.source == "python":
        conversational = {"--whole": args.whole, "--topic": args.topic}
        if given := [name for name, value in conversational.items() if value]:
            raise ValueError(f"{', '.join(given)} select conversations: drop them with --source python")
        if args.max_prompt_chars != 1000 or args.min_prompt_chars:
            raise ValueError("--min/--max-prompt-chars bound conversations' openings: use --max-chars with code")
        if args.max_chars is not None and args.max_chars < MIN_CHUNK_CHARS:
            raise ValueError(
                f"--max-chars {args.max_chars}: chunks under {MIN_CHUNK_CHARS} characters are dropped; "
                "use at least that"
            )
        return
    if args.max_chars is not None:
        raise ValueError("--max-chars sizes code chunks: add --source python, or drop it")
    if args.min_prompt_chars > args.max_prompt_chars:
        raise ValueError(
            f"--min-prompt-chars {args.min_prompt_chars} is above --max-prompt-chars {args.max_prompt_chars}: "
            "no opening can pass; swap them"
        )


def _run_data(args: argparse.Namespace) -> int:
    from hf_specdec.bench import prompts

    def records() -> Iterator[dict]:  # read (seconds) only once the arguments are known to be good
        yield from prompts.sharegpt_v3_conversations()[args.skip :]

    if args.source == "python":
        chunks = code_records(python_roots(), args.n + args.skip, args.max_chars or 2000, min_ascii=args.min_ascii)
        selected = itertools.islice(chunks, args.skip, None)
        what = "code chunks"
    else:
        selected = select_conversations(
            records(), args.n, args.max_prompt_chars, args.topic, args.min_ascii, args.min_prompt_chars, args.whole
        )
        what = "conversations"
    written = 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as sink:
        for record in selected:
            sink.write(json.dumps(record) + "\n")
            written += 1
    short = f" (asked for {args.n}: no more {what} pass the filters)" if written < args.n else ""
    print(f"wrote {written} {what} to {args.out}{short}")
    return 0


# main ---------------------------------------------------------------------------------------------------------

Check = Callable[[argparse.Namespace], None]
Run = Callable[[argparse.Namespace], int]


def build_parser() -> ArgumentParser:
    """The `hf-specdec` parser; each subcommand's namespace carries its `check` and `run` functions."""
    parser = ArgumentParser(prog="hf-specdec", description="Lossless speculative decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, tuple[Callable[[Any], Any], Check, Run]] = {
        "demo": (_add_demo_parser, _check_demo, _run_demo),
        "bench": (bench.add_bench_parser, bench.check_bench_args, bench.run_bench),
        "overhead": (bench.add_overhead_parser, bench.check_overhead_args, bench.run_overhead),
        "gpu": (gpu.add_gpu_parser, gpu.check_gpu_args, gpu.run_gpu),
        "data": (_add_data_parser, _check_data, _run_data),
        "simulate": (simulator.add_simulate_parser, simulator.check_simulate_args, simulator.run_simulate),
        "export": (serving.add_export_parser, serving.check_export_args, serving.run_export),
    }
    for name, (add, check, run) in commands.items():
        add(subparsers)
        subparsers.choices[name].set_defaults(check=check, run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `hf-specdec` on `argv` (default: `sys.argv[1:]`); returns the exit status.

    Bad input (see the module's docstring) ends with one line on stderr and `SystemExit(2)`.
    """
    args = build_parser().parse_args(argv)
    try:
        args.check(args)
        return args.run(args)
    except USER_ERRORS as error:
        print(f"hf-specdec {args.command}: error: {one_line(error)}", file=sys.stderr)
        raise SystemExit(2) from error


if __name__ == "__main__":
    raise SystemExit(main())
