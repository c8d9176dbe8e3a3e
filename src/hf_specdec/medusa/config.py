"""`MedusaConfig`: what a set of Medusa heads is, saved as JSON next to the heads' weights."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

CONFIG_NAME = "medusa_config.json"
HEAD_TYPES = ("medusa", "recurrent", "eagle", "eagle3")


@dataclass
class MedusaConfig:
    """Configuration of Medusa heads (Cai et al. 2023) on a base causal LM.

    Every field is checked when the config is built (and again before it is saved): a value of the wrong type
    raises a `TypeError`, one out of range a `ValueError`, each naming the field.

    Args:
        num_heads (`int`): K heads; head k predicts the token k + 1 steps beyond the base's next token. For
            recurrent heads, the depth they draft to.
        num_layers (`int`): residual SiLU blocks per head, before its vocabulary projection.
        head_type (`str`): `"medusa"`: K independent heads, each guessing from the base's hidden state alone
            (`MedusaHeads`); `"recurrent"`: one drafter that also reads the tokens drafted before it, shared
            by every depth (`hf_specdec.medusa.recurrent.RecurrentHeads`), far more accurate past the first
            depth for the same data; `"eagle"`: a small decoder (`num_layers` layers of the base's own
            architecture) that drafts the base's next features autoregressively with its own KV cache, and grows
            a tree per row and step (`hf_specdec.medusa.eagle.EagleHeads`); `"eagle3"`: EAGLE-3's published
            architecture (`hf_specdec.medusa.eagle3.Eagle3Heads`): one Llama-style layer over the fusion of three
            of the base's layers, with its own final norm and lm_head over a draft vocabulary, drafting as EAGLE
            heads do. For recurrent and EAGLE heads, `num_heads` is the depth they draft to by default and
            train to.
        share_lm_head (`bool`, *optional*): project with the base's own `lm_head` (no extra weights: a big saving
            for large vocabularies) instead of a projection per head, initialised from the base's. Default: `True`,
            except for EAGLE-3 heads, which always have their own lm_head (as published).
        hidden_size (`int`, *optional*): the base's hidden size; filled in from the base when `None`.
        vocab_size (`int`, *optional*): the base's number of logits; filled in from the base when `None`.
        head_vocab_size (`int`, *optional*): when set, the heads propose only this many tokens, the most
            frequent in their training data (their ids are stored with the weights); `None`: every token.
        intermediate_size (`int`, *optional*): EAGLE heads: the width of their decoder's MLP; `None`: the base's
            (a narrower one makes the head cheaper to train and to run, at some accuracy).
        feature_layers (`list[int]`, *optional*): EAGLE-3 heads: which of the base's hidden states they fuse, as
            indices of `output_hidden_states` (0: the embeddings' output, i: the input of layer i); `None`: the
            inputs of layers 2, L // 2 and L - 3 of an L-layer base (EAGLE-3's and vLLM's default), filled in
            from the base.
        layer_config (`dict`, *optional*): EAGLE-3 heads: the config of their one layer (a `LlamaConfig` as a
            dict: width, attention heads, MLP width, norm epsilon, rope; with `"model_type": "qwen3"`, a
            `Qwen3Config`'s: a Qwen3 layer, with per-head query and key norms); `None`: a Llama layer derived from
            the base (`hf_specdec.medusa.eagle3.eagle3_layer_config`), filled in when the heads are built; a dict
            without `hidden_size` (such as `{"model_type": "qwen3"}`) is completed from the base the same way. EAGLE
            heads: when set, their decoder is Llama layers of this config (a published EAGLE-1 checkpoint's own)
            instead of the base's architecture.
        norm_before_residual (`bool`): EAGLE-3 heads: start their layer's residual stream at the normed hidden state
            instead of the hidden state itself (a variant some published checkpoints use).
        norm_before_fc (`bool`): EAGLE-3 heads: one RMS norm over the concatenated fused states before `fc`
            (`input_norm`, a variant vLLM serves).
        fc_norm (`bool`): EAGLE-3 heads: an RMS norm on each fused state before `fc` (`fc_norm.i`, a variant vLLM
            serves).
        norm_output (`bool`): EAGLE-3 heads: feed their layer its normed output (what their lm_head reads) at the
            next depth, instead of the output before the norm (a variant vLLM serves).
        input_norms (`bool`): EAGLE heads: scale the token and the feature with RMS norms before their `fc` (the
            library's design, default); `False`: EAGLE-1's, with no norm there nor on the decoder's first layer's
            input (published EAGLE-1 and 2 checkpoints load so).
        fc_bias (`bool`): EAGLE heads: give their `fc` a bias (EAGLE-1 and 2 as released for Llama-2 and Vicuna).
        base_model_name_or_path (`str`, *optional*): where `from_pretrained` loads the base from: a local
            folder, a name of `hf_specdec.zoo.ZOO` (fetched into the zoo's cache) or a Hub repository id.
        tree (`list[list[int]]`, *optional*): the default verification tree (Medusa "choices"); `None` means
            the preset `"medium"` cut to the number of heads.
        measured_top1 (`list[float]`, *optional*): per-head top-1 accuracy measured after training.
        measured_accuracy (`list[list[float]]`, *optional*): per head, the share of positions where its rank-r
            candidate is right, for r = 0, 1, ...: what `tree=<number of nodes>` builds the best tree from.
        extra (`dict[str, Any]`): free-form facts about the heads (training data, command, coverage), kept as is.
    """

    num_heads: int = 4
    num_layers: int = 1
    head_type: str = "medusa"
    share_lm_head: bool | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    head_vocab_size: int | None = None
    intermediate_size: int | None = None
    feature_layers: list[int] | None = None
    layer_config: dict[str, Any] | None = None
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    input_norms: bool = True
    fc_bias: bool = False
    base_model_name_or_path: str | None = None
    tree: list[list[int]] | None = None
    measured_top1: list[float] | None = None
    measured_accuracy: list[list[float]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range.

        Raises:
            `TypeError`: for a field of the wrong type (a `bool` where a number is wanted included).
            `ValueError`: for a value out of range, an unknown head type, or a tree the heads cannot fill.
        """
        _check_int("num_heads", self.num_heads, minimum=1)
        _check_int("num_layers", self.num_layers, minimum=0)
        _check_choice("head_type", self.head_type, HEAD_TYPES)
        if self.share_lm_head is None:
            self.share_lm_head = self.head_type != "eagle3"
        _check_bool("share_lm_head", self.share_lm_head)
        for name in ("hidden_size", "vocab_size", "head_vocab_size", "intermediate_size"):
            _check_int(name, getattr(self, name), minimum=1, optional=True)
        if self.intermediate_size is not None and self.head_type not in ("eagle", "eagle3"):
            raise ValueError(
                "MedusaConfig.intermediate_size sizes an EAGLE head's decoder, but got "
                f"{self.intermediate_size!r} with head_type={self.head_type!r}: pass head_type='eagle' or 'eagle3', "
                "or drop intermediate_size."
            )
        for name in ("input_norms", "fc_bias", *EAGLE3_VARIANTS):
            _check_bool(name, getattr(self, name))
        _check_layer_config(self.layer_config)
        if self.head_type != "eagle" and (not self.input_norms or self.fc_bias):
            raise ValueError(
                "MedusaConfig.input_norms and fc_bias describe EAGLE heads' input (EAGLE-1's has no norms, and a "
                f"bias in some releases), but got head_type={self.head_type!r}: pass head_type='eagle' or drop them."
            )
        if self.head_type == "eagle3":
            _check_eagle3(self)
            kind = (self.layer_config or {}).get("model_type", "llama")
            if kind not in EAGLE3_LAYER_TYPES:
                raise ValueError(
                    f"MedusaConfig.layer_config: a {kind!r} layer; EAGLE-3 heads' layer is one of {EAGLE3_LAYER_TYPES}."
                )
        elif variants := [name for name in EAGLE3_VARIANTS if getattr(self, name)]:
            raise ValueError(
                f"MedusaConfig.{', '.join(variants)} describe EAGLE-3 heads, but got head_type={self.head_type!r}: "
                "pass head_type='eagle3' or drop them."
            )
        elif self.layer_config is not None and self.head_type != "eagle":
            raise ValueError(
                "MedusaConfig.layer_config describes EAGLE-3 heads' layer (or an EAGLE head's decoder), but got "
                f"head_type={self.head_type!r}: pass head_type='eagle3' (or 'eagle') or drop it."
            )
        elif self.feature_layers is not None:
            raise ValueError(
                "MedusaConfig.feature_layers chooses the base layers EAGLE-3 heads fuse, but got "
                f"{self.feature_layers!r} with head_type={self.head_type!r}: pass head_type='eagle3' or drop "
                "feature_layers."
            )
        elif isinstance(self.layer_config, dict) and self.layer_config.get("model_type", "llama") != "llama":
            raise ValueError(
                f"MedusaConfig.layer_config: a {self.layer_config['model_type']!r} layer, which EAGLE-3 heads have "
                f"only; EAGLE heads' decoder is Llama layers (head_type={self.head_type!r})."
            )
        if isinstance(self.base_model_name_or_path, os.PathLike):
            self.base_model_name_or_path = os.fspath(self.base_model_name_or_path)
        if self.base_model_name_or_path is not None and not isinstance(self.base_model_name_or_path, str):
            raise _type_error("base_model_name_or_path", self.base_model_name_or_path, "a str (folder or name) or None")
        if self.tree is not None:
            self.tree = check_tree_paths("MedusaConfig.tree", self.tree, max_depth=self.num_heads)
        _check_numbers("measured_top1", self.measured_top1, nested=False)
        _check_numbers("measured_accuracy", self.measured_accuracy, nested=True, shares=True)
        if not isinstance(self.extra, dict) or not all(isinstance(key, str) for key in self.extra):
            raise _type_error("extra", self.extra, "a dict with str keys")

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-ready dict (what `save_pretrained` writes)."""
        return asdict(self)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write `medusa_config.json` into `directory` (created if needed), after checking every field again:
        values assigned after construction are checked too, so what is written always loads back."""
        self.validate()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MedusaConfig:
        """A config from a dict such as `to_dict` returns; keys it does not know go into `extra`.

        Raises:
            `TypeError` or `ValueError`: as [`validate`], or when `data` (or its `"extra"`) is not a dict.
        """
        if not isinstance(data, dict):
            raise TypeError(f"A Medusa config is a JSON object (a dict of fields), got {type(data).__name__}.")
        extra = data.get("extra", {})
        if not isinstance(extra, dict):
            raise _type_error("extra", extra, "a dict with str keys")
        known = set(cls.__dataclass_fields__) - {"extra"}
        unknown = {k: v for k, v in data.items() if k not in known and k != "extra"}
        return cls(**{k: v for k, v in data.items() if k in known}, extra={**extra, **unknown})

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> MedusaConfig:
        """Read `medusa_config.json` from `directory`.

        Raises:
            `ValueError`: when the file is missing or is not valid JSON, or a field is out of range; `TypeError`:
                when a field has the wrong type. Each message names the file.
        """
        path = Path(directory) / CONFIG_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as error:
            raise ValueError(
                f"{path} does not exist: pass the folder that `save_pretrained` or the training recipe wrote."
            ) from error
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(
                f"{path} cannot be read as JSON ({error}): the file is damaged. Save or download the heads again."
            ) from error
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as error:
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(f"{path}: {error} Fix the file, or save or download the heads again.") from error


def check_tree_paths(name: str, tree: Any, max_depth: int | None = None) -> list[list[int]]:
    """`tree` as Medusa choices (a list of paths, each a non-empty list of candidate ranks), checked.

    Args:
        name (`str`): the argument or field the tree came from, for messages.
        tree: what was passed.
        max_depth (`int`, *optional*): the deepest path allowed (the number of heads).

    Returns:
        `list[list[int]]`: the paths as lists (tuples are accepted).

    Raises:
        `TypeError`: when `tree` is not a list of lists of ints.
        `ValueError`: for an empty tree, a negative rank, a repeated path, a path without its parent, or a path
            deeper than `max_depth`.
    """
    shape = "a list of paths, each a non-empty list of candidate ranks (ints >= 0), e.g. [[0], [1], [0, 0]]"
    if not isinstance(tree, list | tuple) or not all(isinstance(path, list | tuple) for path in tree):
        raise TypeError(f"{name} takes {shape}; got {tree!r}.")
    if any(not isinstance(rank, int) or isinstance(rank, bool) for path in tree for rank in path):
        raise TypeError(f"{name} takes {shape}; got {tree!r}.")
    paths = [tuple(path) for path in tree]
    if not paths or any(not path or min(path) < 0 for path in paths):
        raise ValueError(f"{name} takes {shape}; got {tree!r}.")
    if len(set(paths)) != len(paths):
        raise ValueError(f"{name} lists a path more than once: list each path once; got {tree!r}.")
    present = set(paths)
    if missing := next((path for path in paths if len(path) > 1 and path[:-1] not in present), None):
        raise ValueError(
            f"{name}: path {list(missing)} has no parent {list(missing[:-1])}; every prefix of a path must be a path. "
            f"Got {tree!r}."
        )
    if max_depth is not None and (depth := max(len(path) for path in paths)) > max_depth:
        raise ValueError(
            f"{name} is {depth} deep but the heads draft {max_depth} deep: cut its paths to {max_depth} ranks or add "
            f"heads. Got {tree!r}."
        )
    return [list(path) for path in paths]


EAGLE3_LAYER_TYPES = ("llama", "qwen3")
"""The layers EAGLE-3 heads are made of: Llama's (what every engine serves), or Qwen3's (Llama's with per-head
query and key norms, what vLLM's `Eagle3Qwen3ForCausalLM` computes)."""

EAGLE3_VARIANTS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
"""The options of EAGLE-3 heads that published variants set (vLLM's names)."""


def _check_eagle3(config: MedusaConfig) -> None:
    """EAGLE-3's fixed shape: one layer, its own lm_head, and base layers to fuse given as hidden-state indices."""
    if config.num_layers != 1:
        raise ValueError(
            f"EAGLE-3 heads have exactly one layer (the published `midlayer`), got num_layers={config.num_layers}: "
            "drop num_layers, or use head_type='eagle' for a deeper decoder."
        )
    if config.share_lm_head:
        raise ValueError(
            "EAGLE-3 heads project with their own lm_head over a draft vocabulary (as published): drop "
            "share_lm_head=True, or use head_type='eagle' to project with the base's lm_head."
        )
    layers = config.feature_layers
    if layers is None:
        return
    if not isinstance(layers, list | tuple) or any(not isinstance(i, int) or isinstance(i, bool) for i in layers):
        raise _type_error("feature_layers", layers, "a list of hidden-state indices (ints) or None")
    if not layers or min(layers) < 0:
        raise ValueError(
            f"MedusaConfig.feature_layers must list at least one hidden-state index >= 0 (0: the embeddings' output, "
            f"i: the input of layer i), got {layers!r}."
        )
    config.feature_layers = list(layers)


def _check_layer_config(layer_config: Any) -> None:
    if layer_config is not None and not (
        isinstance(layer_config, dict) and all(isinstance(key, str) for key in layer_config)
    ):
        raise _type_error("layer_config", layer_config, "a dict (a LlamaConfig's fields) or None")


def _type_error(name: str, value: Any, takes: str) -> TypeError:
    return TypeError(f"MedusaConfig.{name} must be {takes}, got {value!r} ({type(value).__name__}).")


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    takes = f"an int >= {minimum}" + (" or None" if optional else "")
    if not isinstance(value, int) or isinstance(value, bool):
        raise _type_error(name, value, takes)
    if value < minimum:
        raise ValueError(f"MedusaConfig.{name} must be {takes}, got {value!r}.")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _type_error(name, value, "True or False")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise _type_error(name, value, f"one of {choices}")
    if value not in choices:
        raise ValueError(f"MedusaConfig.{name} must be one of {choices}, got {value!r}.")


def _check_numbers(name: str, value: Any, nested: bool, shares: bool = False) -> None:
    """`None`, or a list of finite numbers (`nested`: a list of such lists, one per head); `shares`: each in
    [0, 1]. (Top-1 accuracies are for reading only, and are not held to [0, 1].)"""
    if value is None:
        return
    kind = "accuracies in [0, 1]" if shares else "finite numbers"
    takes = f"a list of lists of {kind}, one list per head" if nested else f"a list of {kind}"
    rows = value if nested else [value]
    if not isinstance(value, list | tuple) or not all(isinstance(row, list | tuple) for row in rows):
        raise _type_error(name, value, takes + " or None")
    numbers = [x for row in rows for x in row]
    if any(not isinstance(x, Real) or isinstance(x, bool) for x in numbers):
        raise _type_error(name, value, takes + " or None")
    if any(not math.isfinite(x) or (shares and not 0.0 <= x <= 1.0) for x in numbers):
        raise ValueError(f"MedusaConfig.{name} must be {takes}, got {value!r}.")
