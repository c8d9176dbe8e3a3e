"""`hf-specdec gpu`: the one command to run on a GPU when one is at hand (see `hf_specdec.bench.gpu`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from hf_specdec.cli_args import HelpFormatter, cpu_or_cuda, output_file, positive_float
from hf_specdec.generation.kv_cache import bucket


def add_gpu_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the `gpu` subcommand."""
    gpu = subparsers.add_parser(
        "gpu",
        help="measure a GPU (random-weight models in published shapes) and predict each method's speedup there",
        description="On one device, with no download: build random-weight Qwen2.5-1.5B/0.5B and Llama-3.1-8B/"
        "3.2-1B, time the target's verification forward V(n) and the draft's forward, eager and compiled "
        "(static cache, torch.compile), and the host's time and reads per step; combine them with the acceptance "
        "recorded on real models into a predicted speedup per method. Prints markdown tables; stops measuring at "
        "--budget-seconds. --device cpu --tiny runs the whole command on a CPU in seconds.",
        formatter_class=HelpFormatter,
    )
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu.add_argument(
        "--device",
        type=cpu_or_cuda,
        default=default_device,
        help="cuda, cuda:N or cpu (default: cuda where torch sees one, else cpu; here %(default)s)",
    )
    gpu.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16", help="model dtype")
    from hf_specdec.bench.real_sizes import PAIRS, REAL_SIZES

    gpu.add_argument(
        "--pairs",
        type=_pairs,
        default=None,
        help=f"comma-separated target:draft, of {sorted(REAL_SIZES)} (default: "
        f"{','.join(f'{t}:{d}' for t, d in PAIRS)})",
    )
    gpu.add_argument(
        "--compiled-widths",
        type=_widths,
        default="1,4,8,16,24",
        help="verification widths to time compiled (of 1, 2, 3, 4, 6, 8, 12, 16, 24, ..., the widths the loop pads "
        "to); 'none' skips compiling",
    )
    gpu.add_argument("--budget-seconds", type=positive_float, default=240.0, help="stop measuring after this long")
    gpu.add_argument("--tiny", action="store_true", help="two small layers per model: a quick check of the command")
    gpu.add_argument("--json", type=output_file, default=None, help="also write every number to this JSON file")
    gpu.add_argument(
        "--tests", action="store_true", help="then run the CUDA tests of the repository (pytest -m cuda tests/)"
    )


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    from hf_specdec.bench.real_sizes import REAL_SIZES

    pairs = []
    for item in text.split(","):
        names = item.strip().split(":")
        if len(names) != 2 or any(name not in REAL_SIZES for name in names):
            raise argparse.ArgumentTypeError(f"{item!r}: pass target:draft from {sorted(REAL_SIZES)}")
        pairs.append((names[0], names[1]))
    return tuple(pairs)


def _widths(text: str) -> tuple[int, ...]:
    if text.strip() == "none":
        return ()
    try:
        widths = tuple(sorted({int(w) for w in text.split(",")}))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated widths, e.g. 1,2,4,8,16, or none") from error
    if any(w < 1 or bucket(w) != w for w in widths) or 1 not in widths:
        raise argparse.ArgumentTypeError(
            f"{text!r}: widths of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ... (the loop pads to them), 1 included"
        )
    return widths


def check_gpu_args(args: argparse.Namespace) -> None:
    """A CUDA device must exist; the CUDA tests need the repository's tests/ folder."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device here: pass --device cpu (with --tiny).")
    if args.tests and not Path("tests").is_dir():
        raise ValueError("--tests runs the repository's tests/: run the command from the repository's root.")


def run_gpu(args: argparse.Namespace) -> int:
    from hf_specdec.bench.gpu import format_device_check, run_device_check

    result = run_device_check(
        args.device, getattr(torch, args.dtype), args.pairs, args.compiled_widths, args.budget_seconds, args.tiny
    )
    print(format_device_check(result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.tests:
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests/"])
    return 0
