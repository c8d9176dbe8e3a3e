"""`MedusaConfig`: what a set of Medusa heads is, saved as JSON next to the heads' weights."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CONFIG_NAME = "medusa_config.json"
HEAD_TYPES = ("medusa", "recurrent", "eagle")


@dataclass
class MedusaConfig:
    """Configuration of Medusa heads (Cai et al. 2023) on a base causal LM.

    Args:
        num_heads (`int`): K heads; head k predicts the token k + 1 steps beyond the base's next token. For
            recurrent heads, the depth they draft to.
        num_layers (`int`): residual SiLU blocks per head, before its vocabulary projection.
        head_type (`str`): `"medusa"`: K independent heads, each guessing from the base's hidden state alone
            (`MedusaHeads`); `"recurrent"`: one drafter that also reads the tokens drafted before it, shared
            by every depth (`hf_specdec.medusa.recurrent.RecurrentHeads`), far more accurate past the first
            depth for the same data; `"eagle"`: a small decoder (`num_layers` layers of the base's own
            architecture) that drafts the base's next features autoregressively with its own KV cache, and grows
            a tree per row and step (`hf_specdec.medusa.eagle.EagleHeads`). For recurrent and EAGLE heads,
            `num_heads` is the depth they draft to by default and train to.
        share_lm_head (`bool`): project with the base's own `lm_head` (no extra weights: a big saving for large
            vocabularies) instead of a projection per head, initialised from the base's.
        hidden_size (`int`, *optional*): the base's hidden size; filled in from the base when `None`.
        vocab_size (`int`, *optional*): the base's number of logits; filled in from the base when `None`.
        head_vocab_size (`int`, *optional*): when set, the heads propose only this many tokens, the most
            frequent in their training data (their ids are stored with the weights); `None`: every token.
        intermediate_size (`int`, *optional*): EAGLE heads: the width of their decoder's MLP; `None`: the base's
            (a narrower one makes the head cheaper to train and to run, at some accuracy).
        base_model_name_or_path (`str`, *optional*): where `from_pretrained` loads the base from.
        tree (`list[list[int]]`, *optional*): the default verification tree (Medusa "choices"); `None` means
            the preset `"medium"` cut to the number of heads.
        measured_top1 (`list[float]`, *optional*): per-head top-1 accuracy measured after training.
        measured_accuracy (`list[list[float]]`, *optional*): per head, the share of positions where its rank-r
            candidate is right, for r = 0, 1, ...: what `tree=<number of nodes>` builds the best tree from.
    """

    num_heads: int = 4
    num_layers: int = 1
    head_type: str = "medusa"
    share_lm_head: bool = True
    hidden_size: int | None = None
    vocab_size: int | None = None
    head_vocab_size: int | None = None
    intermediate_size: int | None = None
    base_model_name_or_path: str | None = None
    tree: list[list[int]] | None = None
    measured_top1: list[float] | None = None
    measured_accuracy: list[list[float]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.num_heads, int) or self.num_heads < 1:
            raise ValueError(f"num_heads must be a positive integer, got {self.num_heads!r}.")
        if not isinstance(self.num_layers, int) or self.num_layers < 0:
            raise ValueError(f"num_layers must be a non-negative integer, got {self.num_layers!r}.")
        if self.head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES}, got {self.head_type!r}.")
        if self.head_vocab_size is not None and (not isinstance(self.head_vocab_size, int) or self.head_vocab_size < 1):
            raise ValueError(f"head_vocab_size must be a positive integer or None, got {self.head_vocab_size!r}.")
        if self.intermediate_size is not None and self.head_type != "eagle":
            raise ValueError("intermediate_size sizes an EAGLE head's decoder: it needs head_type='eagle'.")
        if self.intermediate_size is not None and (
            not isinstance(self.intermediate_size, int) or self.intermediate_size < 1
        ):
            raise ValueError(f"intermediate_size must be a positive integer or None, got {self.intermediate_size!r}.")
        if self.tree is not None and max(len(path) for path in self.tree) > self.num_heads:
            raise ValueError(f"The tree is deeper than the {self.num_heads} heads can fill: cut it or add heads.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save_pretrained(self, directory: str | Path) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MedusaConfig:
        known = set(cls.__dataclass_fields__) - {"extra"}
        unknown = {k: v for k, v in data.items() if k not in known and k != "extra"}
        return cls(**{k: v for k, v in data.items() if k in known}, extra={**data.get("extra", {}), **unknown})

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> MedusaConfig:
        return cls.from_dict(json.loads((Path(directory) / CONFIG_NAME).read_text()))
