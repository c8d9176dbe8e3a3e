"""`hf-specdec export`: heads from a folder or the Hub, written in a serving engine's layout."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from hf_specdec.serving.export import ENGINES, export_heads

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="write Medusa heads for vLLM, TGI or TensorRT-LLM (docs/serving.md)")
    export.add_argument("heads", help="folder or Hub id of heads (this library's, or any layout it imports)")
    export.add_argument("--to", choices=ENGINES, required=True, help="the engine whose layout to write")
    export.add_argument("--out", type=Path, required=True, help="the folder to write")
    export.add_argument("--base", default=None, help="zoo name, folder or Hub id of the base; default: the heads'")
    export.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16", help="dtype of the written weights")


def run_export(args: argparse.Namespace) -> int:
    from hf_specdec.medusa.model import MedusaForCausalLM

    dtype = _DTYPES[args.dtype]
    base = None
    if args.base is not None:
        from hf_specdec.zoo import load_model

        base = load_model(args.base, dtype=dtype)[0]
    try:
        model = MedusaForCausalLM.from_pretrained(args.heads, base_model=base, dtype=dtype)
        out = export_heads(model, args.out, args.to, dtype=dtype)
    except ValueError as error:
        raise SystemExit(f"hf-specdec export: {error}") from error
    print(f"wrote {args.to} heads to {out} (serve them as docs/serving.md shows)")
    return 0
