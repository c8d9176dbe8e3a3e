"""The model card of a set of heads, built with `huggingface_hub`'s `ModelCard` and `ModelCardData`.

Metadata (`library_name`, `base_model`, tags, data sets) goes into the card's YAML header, where the Hub reads
it; the body says what the heads are, how they were trained (the command), how accurate each is on held-out
data, the speedup where one was measured, and how to use them. Everything comes from the heads' `MedusaConfig`,
so a card written at save time and one written at push time are the same.
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from hf_specdec.medusa.config import MedusaConfig

LIBRARY_NAME = "hf_specdec"
TAGS = ["medusa", "speculative-decoding"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_id(name: str | None) -> str | None:
    """`name` if it reads as a Hub repository id (`owner/name`, not an existing local path), else `None`: the
    card's metadata may only name Hub repositories."""
    if not name or not _HUB_ID.match(name) or Path(name).exists():
        return None
    return name


def model_card(config: MedusaConfig, repo_id: str | None = None) -> ModelCard:
    """The card of heads with this config; `repo_id` (where they are published) goes into the usage snippet."""
    extra = config.extra
    datasets = [d for source in str(extra.get("training_data", "")).split(",") if (d := hub_id(source.strip()))]
    data = ModelCardData(
        library_name=LIBRARY_NAME,
        base_model=hub_id(config.base_model_name_or_path),
        tags=[*TAGS, config.head_type],
        datasets=datasets or None,
        pipeline_tag="text-generation",
    )
    base = config.base_model_name_or_path or "a causal LM"
    lines = [
        f"# Medusa heads for {base}",
        "",
        f"Draft heads for lossless speculative decoding with `{LIBRARY_NAME}` on {base}: the "
        "base verifies every drafted token, so outputs are the base's own.",
        "",
        f"- heads: {config.num_heads} ({config.head_type}), residual blocks per head: {config.num_layers}, "
        f"shared lm_head: {config.share_lm_head}, draft vocabulary: {config.head_vocab_size or 'every token'}",
        f"- tree: {config.tree if config.tree is not None else 'preset medium'}",
    ]
    if "training_data" in extra:
        lines.append(f"- training data: {extra['training_data']}")
    if command := extra.get("training_command"):
        lines += ["", "## Training", "", "```bash", command, "```"]
    lines += _accuracy_table(config)
    if (speedup := extra.get("measured_speedup")) is not None:
        lines += ["", f"Measured speedup over plain `generate()`: {speedup}."]
    snippet_id = repo_id or "<this folder or repo>"
    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from hf_specdec import MedusaForCausalLM",
        "",
        f'model = MedusaForCausalLM.from_pretrained("{snippet_id}")  # loads the base named in the config too',
        "out = model.generate(**inputs, medusa=True, max_new_tokens=256)",
        "```",
        "",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def _accuracy_table(config: MedusaConfig) -> list[str]:
    if not config.measured_top1:
        return []
    top5 = config.extra.get("top5")
    header = "| | " + " | ".join(f"head {k + 1}" for k in range(len(config.measured_top1))) + " |"
    rows = [
        "",
        "## Held-out accuracy",
        "",
        header,
        "|---" * (len(config.measured_top1) + 1) + "|",
        "| top-1 | " + " | ".join(f"{a:.3f}" for a in config.measured_top1) + " |",
    ]
    if top5:
        rows.append("| top-5 | " + " | ".join(f"{a:.3f}" for a in top5) + " |")
    if (tau := config.extra.get("expected_tau")) is not None:
        rows += ["", f"Expected tokens per step (tau) of the stored tree for these accuracies: {tau}."]
    return rows
