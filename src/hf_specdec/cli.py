"""The `hf-specdec` command line: `demo` and `bench`."""

from __future__ import annotations

import argparse

import torch

from hf_specdec.bench.cli import add_bench_parser, run_bench
from hf_specdec.demo import DEFAULT_PROMPTS, run_demo

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="plain generate() and generate(assistant=...) side by side")
    demo.add_argument("--target", default="qwen2.5-coder-1.5b", help="zoo name, local folder or Hub id")
    demo.add_argument("--draft", default="qwen2.5-coder-0.5b", help="zoo name, local folder or Hub id")
    demo.add_argument("--prompt", action="append", help="a prompt (repeat for a batch); default: two built-in")
    demo.add_argument("--max-new-tokens", type=int, default=96)
    demo.add_argument("--num-assistant-tokens", type=int, default=None, help="tokens drafted per step (at most)")
    demo.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-specdec", description="Lossless speculative decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_demo_parser(subparsers)
    add_bench_parser(subparsers)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
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
