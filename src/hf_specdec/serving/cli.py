"""`hf-specdec export`: heads from a folder or the Hub (a published EAGLE draft included), written in a serving
engine's layout."""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_specdec.cli_args import (
    DTYPES,
    MODEL_HELP,
    HelpFormatter,
    heads_source,
    model_source,
    non_empty,
    output_folder,
    require_zoo_converter,
)
from hf_specdec.extras import require
from hf_specdec.medusa.config import CONFIG_NAME, MedusaConfig
from hf_specdec.serving.eagle_export import LAYOUTS
from hf_specdec.serving.export import (
    ENGINES,
    check_base_adapters,
    check_exportable,
    check_merged_base_dir,
    engine_base_name,
    export_pretrained,
)


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the `export` subcommand to an `hf-specdec` parser's subparsers."""
    export = subparsers.add_parser(
        "export",
        help="write heads for vLLM, TGI or TensorRT-LLM (docs/serving.md)",
        description="Write Medusa heads in the layout vLLM, TGI or TensorRT-LLM loads, and EAGLE-3 heads (or EAGLE-1 "
        "drafts loaded from a release) in the layout vLLM's EAGLE methods load (docs/serving.md).",
        formatter_class=HelpFormatter,
    )
    export.add_argument(
        "heads", type=heads_source, help="folder or Hub id (org/name) of heads (this library's, or a layout it reads)"
    )
    export.add_argument("--to", choices=ENGINES, required=True, help="the engine whose layout to write")
    export.add_argument("--out", type=output_folder, required=True, help="the folder to write")
    export.add_argument("--base", type=model_source, help=f"the heads' base, a {MODEL_HELP}; default: the heads'")
    export.add_argument(
        "--base-name",
        type=non_empty,
        help="the base as the engine will load it, for TGI (default: --merge-base-into, else --base's folder or id)",
    )
    export.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype of the written weights")
    export.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="published",
        help="EAGLE-3 heads: the layout EAGLE-3 releases use (published), or vllm-project/speculators' format",
    )
    export.add_argument(
        "--merge-base-into",
        type=output_folder,
        metavar="DIR",
        help="for heads trained with LoRA adapters on the base (Medusa-2): write the base with the adapters merged "
        "in (PEFT's merge_and_unload) into DIR, and serve that base; such heads are refused without it",
    )


def check_export_args(args: argparse.Namespace) -> None:
    """Refuse, before any model loads, what the export would fail on: a folder without heads, heads the engine cannot
    serve, heads that name no base, base adapters without --merge-base-into (or the reverse), a missing optional
    dependency."""
    require_zoo_converter(args.base)
    folder = Path(args.heads)
    if not folder.is_dir():  # a Hub id: checked once fetched
        return
    config = heads_config(folder, "the folder")
    check_exportable(config, args.to, args.layout)
    if args.base is None:
        if not config.base_model_name_or_path:
            raise ValueError(f"The heads in {folder} name no base: pass --base (a {MODEL_HELP})")
        require_zoo_converter(config.base_model_name_or_path)
    adapters = _has_adapters(folder)
    check_base_adapters(adapters, args.to, args.out, args.merge_base_into)
    if args.merge_base_into is not None:
        check_merged_base_dir(args.merge_base_into, _base_folder(args.base or config.base_model_name_or_path))
    if adapters:
        require("train", "peft", purpose="merging the heads' base adapters into the base")


def heads_config(folder: Path, what: str) -> MedusaConfig:
    """The configuration of the heads in `folder`, in any layout the library reads (`MedusaForCausalLM.from_pretrained`
    loads the same); their weights are read only for other layouts than the library's own.

    Args:
        what (`str`): how a message names the folder, e.g. `"--medusa"`.

    Raises:
        `ValueError`: when `folder` holds no heads.
    """
    from hf_specdec.medusa.importer import no_heads_message, read_heads

    if (folder / CONFIG_NAME).exists():
        return MedusaConfig.from_pretrained(folder)
    imported = read_heads(folder)
    if imported is None:
        raise ValueError(no_heads_message(folder, f"{what} {folder} holds no heads"))
    return imported.config


def _base_folder(name: str | None) -> Path | None:
    """The folder a base named so loads from, if it is a local one (a zoo model's converted folder included)."""
    from hf_specdec.zoo import ZOO, cache_dir

    if name in ZOO:
        return cache_dir() / "models" / name  # where `zoo.model_path` keeps it
    return Path(name) if name and Path(name).is_dir() else None


def _has_adapters(folder: Path) -> bool:
    from hf_specdec.medusa.model import ADAPTER_FOLDER

    return (folder / ADAPTER_FOLDER).is_dir()


def run_export(args: argparse.Namespace) -> int:
    """Run `hf-specdec export` on checked arguments; returns the exit status."""
    from hf_specdec.zoo import load_model

    dtype = DTYPES[args.dtype]
    base = None if args.base is None else load_model(args.base, dtype=dtype)[0]  # else the one the heads name
    base_name = args.base_name
    if base_name is None and args.merge_base_into is None and args.base is not None:
        base_name = engine_base_name(args.base)
    out = export_pretrained(
        args.heads,
        args.out,
        args.to,
        base_model=base,
        dtype=dtype,
        base_name=base_name,
        merged_base_dir=args.merge_base_into,
        layout=args.layout,
    )
    print(f"wrote {args.to} heads to {out} (serve them as docs/serving.md shows)")
    if args.merge_base_into is not None:
        print(
            f"wrote the base with the heads' LoRA adapters merged in to {args.merge_base_into}: serve that base, "
            "not the original one"
        )
    return 0
