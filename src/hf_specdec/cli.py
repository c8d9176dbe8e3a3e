"""The `hf-specdec` command line: `demo`, `bench`, `simulate`, `data` and `export`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from hf_specdec.bench.cli import add_bench_parser, run_bench
from hf_specdec.bench.demo import DEFAULT_PROMPTS, run_demo
from hf_specdec.serving.cli import add_export_parser, run_export
from hf_specdec.simulator.cli import add_simulate_parser, run_simulate
from hf_specdec.topics import TOPICS, select_conversations

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="plain generate() and generate(assistant=...) side by side")
    demo.add_argument("--target", default="qwen2.5-coder-1.5b", help="zoo name, local folder or Hub id")
    demo.add_argument("--draft", default="qwen2.5-coder-0.5b", help="zoo name, local folder or Hub id")
    demo.add_argument("--prompt", action="append", help="a prompt (repeat for a batch); default: one built-in")
    demo.add_argument("--max-new-tokens", type=int, default=96)
    demo.add_argument("--num-assistant-tokens", type=int, default=None, help="tokens drafted per step (at most)")
    demo.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")


def _add_data_parser(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="export ShareGPT V3 conversations (from its PyPI wheel) as JSONL")
    data.add_argument("--n", type=int, default=1000, help="conversations to export")
    data.add_argument("--max-prompt-chars", type=int, default=1000, help="skip conversations opening longer")
    data.add_argument("--min-prompt-chars", type=int, default=0, help="skip conversations opening shorter")
    data.add_argument("--skip", type=int, default=0, help="skip this many conversations first")
    data.add_argument(
        "--topic",
        action="append",
        choices=TOPICS,
        help="keep only requests about this topic, other: neither (repeat for several; see hf_specdec.topics)",
    )
    data.add_argument(
        "--min-ascii", type=float, default=0.0, help="skip openings with a smaller share of ASCII (0.97: English)"
    )
    data.add_argument("--out", type=Path, required=True, help="the JSONL file to write")


def _export_data(args: argparse.Namespace) -> int:
    from hf_specdec.bench.prompts import sharegpt_v3_conversations

    def records() -> Iterator[dict]:  # read (seconds) only once the arguments are known to be good
        yield from sharegpt_v3_conversations()[args.skip :]

    try:
        selected = select_conversations(
            records(),
            args.n,
            args.max_prompt_chars,
            args.topic,
            args.min_ascii,
            args.min_prompt_chars,
        )
    except ValueError as error:
        raise SystemExit(f"hf-specdec data: {error}") from error
    written = 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as sink:
        for record in selected:
            sink.write(json.dumps(record) + "\n")
            written += 1
    short = f" (asked for {args.n}: no more conversations pass the filters)" if written < args.n else ""
    print(f"wrote {written} conversations to {args.out}{short}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-specdec", description="Lossless speculative decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_demo_parser(subparsers)
    add_bench_parser(subparsers)
    _add_data_parser(subparsers)
    add_simulate_parser(subparsers)
    add_export_parser(subparsers)
    args = parser.parse_args(argv)
    if args.command == "simulate":
        return run_simulate(args)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "data":
        return _export_data(args)
    if args.command == "export":
        return run_export(args)
    identical = run_demo(
        args.target,
        args.draft,
        args.prompt or DEFAULT_PROMPTS,
        args.max_new_tokens,
        _DTYPES[args.dtype],
        args.num_assistant_tokens,
    )
    return 0 if identical or args.dtype != "float32" else 1


if __name__ == "__main__":
    raise SystemExit(main())
