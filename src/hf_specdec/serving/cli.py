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
    export.add_argument(
        "--base-name",
        default=None,
        help="the base as the engine will load it, for TGI (default: --base's folder or id)",
    )
    export.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16", help="dtype of the written weights")


def run_export(args: argparse.Namespace) -> int:
    from hf_specdec.medusa.model import MedusaForCausalLM
    from hf_specdec.zoo import ZOO, load_model, model_path

    dtype = _DTYPES[args.dtype]
    name = args.base or _zoo_base(args.heads)
    base = None if name is None else load_model(name, dtype=dtype)[0]
    base_name = args.base_name or (str(model_path(name)) if name in ZOO else name)
    try:
        model = MedusaForCausalLM.from_pretrained(args.heads, base_model=base, dtype=dtype)
        out = export_heads(model, args.out, args.to, dtype=dtype, base_name=base_name)
    except ValueError as error:
        raise SystemExit(f"hf-specdec export: {error}") from error
    print(f"wrote {args.to} heads to {out} (serve them as docs/serving.md shows)")
    return 0


def _zoo_base(heads: str) -> str | None:
    """The zoo name the heads' config gives as their base (the recipe writes `--base` as given), if any: a zoo
    name is not a path `from_pretrained` can load."""
    from hf_specdec.medusa.config import CONFIG_NAME, MedusaConfig
    from hf_specdec.medusa.model import local_directory
    from hf_specdec.zoo import ZOO

    directory = local_directory(heads)
    if not (directory / CONFIG_NAME).exists():
        return None
    name = MedusaConfig.from_pretrained(directory).base_model_name_or_path
    return name if name in ZOO else None
