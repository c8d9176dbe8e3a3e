"""What every `hf-specdec` subcommand shares: a parser whose errors are one line, argument types that refuse
malformed and out-of-range values and unusable paths while parsing, and checks of optional dependencies that
name the extra to install. Subcommands build their parsers from these (`hf_specdec.cli` puts them together)."""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import NoReturn

import torch

from hf_specdec.cpu_linears import can_pack_linears
from hf_specdec.extras import MissingExtraError, require
from hf_specdec.machine import fast_dtype
from hf_specdec.zoo import ZOO, cache_dir

USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    MissingExtraError,
)
"""What bad input raises (a missing optional dependency included), reported by `main` as one line and exit status 2."""

ZOO_NAMES = ", ".join(ZOO)
MODEL_HELP = f"zoo name ({ZOO_NAMES}), local folder or Hub id (org/name)"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
#: The `--dtype` choices of the commands that run models: `DTYPES`' names, and `auto` (`model_dtype`).
MODEL_DTYPES = ["auto", *sorted(DTYPES)]
#: What `--dtype auto` picks (`model_dtype`), for the commands' help.
AUTO_DTYPE = (
    "auto: bfloat16 on a GPU that computes it and on a CPU with AVX512-BF16 or AMX, float32 on other CPUs (where bf16 "
    "runs several times slower)"
)
MODEL_DTYPE_HELP = f"dtype of the models; {AUTO_DTYPE}"
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


def model_dtype(name: str, device: str) -> torch.dtype:
    """The dtype `--dtype name` runs models in on `device`: `DTYPES[name]`, or for `auto` the fastest there
    (`hf_specdec.machine.fast_dtype`)."""
    return fast_dtype(device) if name == "auto" else DTYPES[name]


def check_pack_linears(dtype: torch.dtype, device: str, compile: bool = False) -> None:
    """Refuse `--pack-linears` where it cannot run: models of another dtype than float32, a device other than the
    CPU, compiled forwards (not supported), a torch build without oneDNN's linear operators."""
    if not device.startswith("cpu"):
        raise ValueError(f"--pack-linears runs linear layers on the CPU, not on {device}: drop --pack-linears.")
    if dtype != torch.float32:
        name = str(dtype).removeprefix("torch.")
        raise ValueError(f"--pack-linears runs float32 linear layers, these models run {name}: add --dtype float32.")
    if compile:
        raise ValueError("--pack-linears runs the layers eagerly: drop --compile or --pack-linears.")
    if not can_pack_linears():
        raise ValueError(
            f"torch {torch.__version__} cannot run oneDNN's linear operators here (hf_specdec.cpu_linears."
            "can_pack_linears()): drop --pack-linears."
        )


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


def device(text: str) -> str:
    """A device that is here: `cpu`, `cuda`, `cuda:N`, `mps`."""
    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:0, got {text!r}") from None
    if parsed.type == "cpu":
        return text
    backend = {"cuda": torch.cuda, "mps": torch.backends.mps}.get(parsed.type)
    if backend is None or not backend.is_available():
        raise argparse.ArgumentTypeError(f"no {parsed.type} device here: pass --device cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"there is no {text} here ({torch.cuda.device_count()} CUDA devices)")
    return text


def cpu_or_cuda(text: str) -> str:
    """`device`, on a CPU or a CUDA GPU only."""
    if not text.startswith(("cpu", "cuda")):
        raise argparse.ArgumentTypeError(f"{text!r}: this command runs on cuda or cpu")
    return device(text)


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


def require_zoo_converter(*names: str | None) -> None:
    """Check that gguf is installed when any of the zoo models `names` still has to be converted (its first use)."""
    for name in names:
        if name in ZOO and not (cache_dir() / "models" / name).is_dir():  # where `zoo.model_path` keeps it
            require("models", "gguf", purpose=f"converting zoo model {name} on its first use")
