"""Read published EAGLE drafts (layouts in `hf_specdec.medusa.eagle_layouts`): EAGLE-3 as SafeAILab, SpecForge
and AngelSlim release it, EAGLE-3 in the speculators format, and EAGLE-1 and 2 as SafeAILab releases them or as
vLLM loads them.

They load as this library's heads computing the same function: EAGLE-3 drafts as `Eagle3Heads`, EAGLE-1 drafts
as `EagleHeads` with EAGLE-1's options (`input_norms=False`, `fc_bias` where the file has one, the draft's own
Llama layer config). A stored `embed_tokens.weight` is not loaded: drafts read the base's embeddings, as the
published code and vLLM do (a log line says so when the stored one differs from the base's).

Which of the target's states EAGLE-3 fuses: `eagle_aux_hidden_state_layer_ids` (at the top of the config or in
its `eagle_config`) read as vLLM reads them, as indices of the target's hidden states (k: the input of layer k),
concatenated in increasing order, each once, whatever order the config lists them in; when the config gives
none, the inputs of layers 2, L // 2 and L - 3 of an L-layer target (vLLM's and SafeAILab's default). SGLang and
SpecForge read explicit ids one layer later (k: the output of layer k), so a draft whose ids were written for them
fuses, here as in vLLM, the layers below the ones it was trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hf_specdec.medusa.config import MedusaConfig
from hf_specdec.medusa.eagle_layouts import (
    EAGLE3_ARCHITECTURES,
    LAYER_PREFIXES,
    SPECULATORS_TYPE,
    eagle1_from_published,
    eagle3_from_published,
    layer_config_from_published,
)

logger = logging.getLogger(__name__)


@dataclass
class ImportedEagle:
    """A published EAGLE draft read from a folder, before it meets its base.

    Attributes:
        config (`MedusaConfig`): the heads' configuration.
        state (`dict[str, torch.Tensor]`): their weights in this library's names.
        lm_head (`torch.Tensor`, *optional*): an EAGLE-1 draft's stored lm_head; [`bind`] decides whether it is
            the base's own.
        embeddings (`torch.Tensor`, *optional*): a stored `embed_tokens.weight`, compared with the base's.
        layout (`str`): what was read, for messages.
    """

    config: MedusaConfig
    state: dict[str, torch.Tensor]
    lm_head: torch.Tensor | None
    embeddings: torch.Tensor | None
    layout: str

    def bind(
        self, base_lm_head: torch.Tensor, base_embeddings: torch.Tensor | None = None
    ) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
        """The config and weights for heads on a base with this lm_head and these input embeddings: an EAGLE-1
        lm_head equal to the base's is the base's (`share_lm_head=True`), another one the heads' own."""
        if self.embeddings is not None and base_embeddings is not None:
            stored, base = self.embeddings, base_embeddings.detach().to("cpu")
            if stored.shape != base.shape or not torch.equal(stored.to(base.dtype), base):
                logger.info(
                    "%s draft: its stored embed_tokens differ from the base's; the base's are used, as the published "
                    "code and vLLM use them.",
                    self.layout,
                )
        config, state = self.config, dict(self.state)
        if self.lm_head is None:
            return config, state
        reference = base_lm_head.detach().to("cpu")
        if self.lm_head.shape == reference.shape and torch.equal(self.lm_head.to(reference.dtype), reference):
            config.share_lm_head = True
        else:
            config.share_lm_head = False
            state["projections.0.weight"] = self.lm_head
        return config, state


def read_eagle(directory: Path, meta: dict[str, Any]) -> ImportedEagle | None:
    """The EAGLE draft in `directory` (its `config.json` already read into `meta`), or `None` when the folder
    holds none.

    Raises:
        `ValueError`: when the files are there but are not a draft this library computes exactly, with the reason.
    """
    speculators = meta.get("speculators_model_type")
    architectures = meta.get("architectures") or []
    other = [name for name in architectures if "eagle" in name.lower() and name not in EAGLE3_ARCHITECTURES]
    if other and speculators is None:
        raise ValueError(
            f"{directory}: a draft of architecture {other[0]}; this library loads EAGLE-3 drafts of architectures "
            f"{', '.join(EAGLE3_ARCHITECTURES)} (Llama layers, or Qwen3 layers for Eagle3Qwen3ForCausalLM)."
        )
    eagle3_config = speculators is not None or any(name in EAGLE3_ARCHITECTURES for name in architectures)
    files = weight_files(directory)
    if not meta or not files:
        if eagle3_config:
            raise ValueError(f"{directory}: an EAGLE-3 config but no weights (*.safetensors or *.bin) beside it.")
        return None
    keys = _keys(files)
    if "fc.weight" not in keys and not eagle3_config:
        return None
    if speculators is not None and speculators != SPECULATORS_TYPE:
        raise ValueError(
            f"{directory}: a speculators draft of type {speculators!r}; this library loads type {SPECULATORS_TYPE!r}."
        )
    raw = _load(files)
    try:
        if speculators is not None:
            layer_meta = meta.get("transformer_layer_config") or {}
            kind = layer_meta.get("model_type", "llama")  # vLLM builds the layer of this model type
            return _eagle3(raw, meta, layer_meta, "speculators", str(directory), kind)
        if eagle3_config or any(key.startswith(LAYER_PREFIXES["eagle3"]) for key in raw):
            kind = next((EAGLE3_ARCHITECTURES[name] for name in architectures if name in EAGLE3_ARCHITECTURES), "llama")
            return _eagle3(raw, meta, meta, "eagle3", str(directory), kind)
        return _eagle1(raw, meta, str(directory))
    except ValueError as error:
        raise ValueError(f"{directory}: {error}") from error


def _eagle3(
    raw: dict[str, torch.Tensor],
    meta: dict[str, Any],
    layer_meta: dict[str, Any],
    layout: str,
    source: str,
    kind: str,
) -> ImportedEagle:
    eagle = meta.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state") is False:
        raise ValueError(
            "the draft's eagle_config sets use_aux_hidden_state: false (no fusion of the target's layers), which "
            "EAGLE-3 heads always do."
        )
    # Read as vLLM reads them: norm_before_fc from eagle_config first; the others from the config's top level.
    norm_before_fc = bool(eagle.get("norm_before_fc", meta.get("norm_before_fc", False)))
    prefix = LAYER_PREFIXES[layout]
    state, embeddings = eagle3_from_published(raw, prefix, source)
    wanted = ["fc.weight", "norm.weight", "lm_head.weight", "decoder.layers.0.hidden_norm.weight"]
    wanted += ["input_norm.weight"] if norm_before_fc else []
    wanted += [f"decoder.layers.0.self_attn.{n}_norm.weight" for n in ("q", "k")] if kind == "qwen3" else []
    for key in wanted:
        if key not in state:
            name = key.replace("decoder.layers.0.", prefix)
            raise ValueError(f"the EAGLE-3 draft has no {name!r} (found {sorted(raw)[:8]} ...).")
    if "input_norm.weight" in state and not norm_before_fc:  # vLLM drops it too
        logger.info("%s: input_norm.weight is not read (the config does not set norm_before_fc), as in vLLM.", source)
        del state["input_norm.weight"]
    unread = [key for key in state if key.endswith(("q_norm.weight", "k_norm.weight")) and kind != "qwen3"]
    unread += [key for key in state if key.startswith("fc_norm.") and not meta.get("fc_norm")]
    if unread:
        raise ValueError(
            f"the draft holds {unread[0]!r}, which its config does not use: a Llama layer has no q_norm/k_norm "
            "(Eagle3Qwen3ForCausalLM's has), and fc_norm.* needs fc_norm in the config."
        )
    layer_config = layer_config_from_published(layer_meta, kind, speculators=layout == "speculators")
    hidden = layer_config["hidden_size"]
    listed = meta.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    ids = sorted({int(i) for i in listed}) if listed else None  # vLLM fuses sorted(set(ids))
    fused = state["fc.weight"].shape[1]
    # How many states vLLM sizes fc by: num_aux_layers (Qwen3 drafts) or num_aux_hidden_states, else the ids as
    # written, else 3.
    fields = {**layer_meta, **meta}
    names = ("num_aux_layers", "num_aux_hidden_states") if kind == "qwen3" else ("num_aux_hidden_states",)
    count = next((fields[n] for n in names if isinstance(fields.get(n), int)), len(listed) if listed else 3)
    target = meta.get("target_hidden_size") or fused // count
    norms = sorted(key for key in state if key.startswith("fc_norm."))
    if meta.get("fc_norm") and norms != sorted(f"fc_norm.{i}.weight" for i in range(count)):
        raise ValueError(f"fc_norm is set, so the draft needs fc_norm.0 .. fc_norm.{count - 1} (found {norms}).")
    if target != hidden:
        raise ValueError(
            f"the draft's layer is {hidden} wide but it reads target states {target} wide: such drafts embed tokens "
            "with their own embeddings, which this library does not load (its EAGLE-3 heads read the base's)."
        )
    token_ids = state.get("token_ids")
    draft_vocab = meta.get("draft_vocab_size")
    vocab = layer_meta.get("vocab_size") or meta.get("vocab_size")
    rows = state["lm_head.weight"].shape[0]
    if token_ids is None and draft_vocab not in (None, vocab):
        raise ValueError(f"draft_vocab_size is {draft_vocab} (not the vocabulary, {vocab}) but there is no `d2t`.")
    if rows != (draft_vocab or rows) or (token_ids is not None and token_ids.numel() != rows):
        raise ValueError(f"lm_head.weight has {rows} rows, but the config and `d2t` give another draft vocabulary.")
    config = MedusaConfig(
        head_type="eagle3",
        num_heads=_depth(meta),
        num_layers=1,
        share_lm_head=False,
        hidden_size=target,
        vocab_size=vocab,
        head_vocab_size=None if token_ids is None else token_ids.numel(),
        feature_layers=ids,
        layer_config=layer_config,
        norm_before_residual=bool(meta.get("norm_before_residual", layout == "speculators")),
        norm_before_fc=norm_before_fc,
        fc_norm=bool(meta.get("fc_norm", False)),
        norm_output=bool(meta.get("norm_output", False)),
        base_model_name_or_path=_base_name(meta),
    )
    name = "EAGLE-3 (speculators format)" if layout == "speculators" else "EAGLE-3"
    return ImportedEagle(config, state, None, embeddings, name)


def _eagle1(raw: dict[str, torch.Tensor], meta: dict[str, Any], source: str) -> ImportedEagle:
    kind = meta.get("model_type", "llama")
    if kind != "llama":
        raise ValueError(
            f"the EAGLE-1 draft's layers are {kind!r} layers; this library loads EAGLE-1 drafts made of Llama layers "
            "(as released and as vLLM's method='eagle' serves them)."
        )
    state, embeddings, lm_head, num_layers = eagle1_from_published(raw, source)
    layer_config = layer_config_from_published(meta)
    hidden = layer_config["hidden_size"]
    if state["fc.weight"].shape != (hidden, 2 * hidden):
        raise ValueError(
            f"fc.weight is {tuple(state['fc.weight'].shape)}; an EAGLE-1 draft of hidden size {hidden} reads "
            f"[embedding; feature] with one of shape ({hidden}, {2 * hidden})."
        )
    config = MedusaConfig(
        head_type="eagle",
        num_layers=num_layers,
        share_lm_head=True,
        hidden_size=hidden,
        vocab_size=meta.get("vocab_size"),
        layer_config=layer_config,
        input_norms=False,
        fc_bias="fc.bias" in state,
        base_model_name_or_path=_base_name(meta),
    )
    return ImportedEagle(config, state, lm_head, embeddings, "EAGLE-1")


def _depth(meta: dict[str, Any]) -> int:
    """The depth a speculators config proposes to (`speculative_tokens`), else the library's default."""
    methods = (meta.get("speculators_config") or {}).get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return tokens if isinstance(tokens, int) and tokens >= 1 else MedusaConfig.num_heads


def _base_name(meta: dict[str, Any]) -> str | None:
    verifier = (meta.get("speculators_config") or {}).get("verifier") or {}
    name = meta.get("base_model_name_or_path") or verifier.get("name_or_path")
    return name if isinstance(name, str) and name else None


def weight_files(directory: Path) -> list[Path]:
    """A draft's weight files: its safetensors (shards included), else its pickled state dicts."""
    return sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))


def _keys(files: list[Path]) -> set[str]:
    """The weights' names (without the `model.` prefix some conversions add), read without loading safetensors."""
    keys: set[str] = set()
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(file, framework="pt") as handle:
                keys.update(handle.keys())
        else:
            try:  # mapped, not read: the names are enough
                keys.update(torch.load(file, map_location="cpu", weights_only=True, mmap=True))
            except RuntimeError:  # the legacy (non-zip) format cannot be mapped
                keys.update(torch.load(file, map_location="cpu", weights_only=True))
    return {key.removeprefix("model.") for key in keys}


def _load(files: list[Path]) -> dict[str, torch.Tensor]:
    raw: dict[str, torch.Tensor] = {}
    for file in files:
        loaded = (
            load_file(file)
            if file.suffix == ".safetensors"
            else torch.load(file, map_location="cpu", weights_only=True)
        )
        if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
            raise ValueError(f"{file} is not a state dict (a mapping of names to tensors).")
        raw.update({key.removeprefix("model."): value for key, value in loaded.items()})
    return raw
