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

from hf_specdec.medusa.config import EAGLE3_VARIANTS, MedusaConfig

LIBRARY_NAME = "hf_specdec"
TAGS = ["speculative-decoding"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

HEAD_NAMES = {
    "medusa": "Medusa heads",
    "recurrent": "Recurrent draft heads",
    "eagle": "EAGLE draft head",
    "eagle3": "EAGLE-3 draft head",
}
"""What each head type (`MedusaConfig.head_type`) is called, in a card's title and an upload's commit message."""


def hub_id(name: str | None) -> str | None:
    """`name` if it reads as a Hub repository id (`owner/name`, not an existing local path), else `None`: the
    card's metadata may only name Hub repositories."""
    if not name or not _HUB_ID.match(name) or Path(name).exists():
        return None
    return name


def head_structure(config: MedusaConfig) -> list[str]:
    """What the heads of `config` are, as the card's bullet points: the head type's architecture with this
    config's sizes, the projection, the draft vocabulary and the tree they draft."""
    layers = _count(config.num_layers, "layer")
    blocks = _count(config.num_layers, "residual SiLU block")
    vocabulary = f"{config.head_vocab_size} most frequent tokens" if config.head_vocab_size else "every token"
    width = config.intermediate_size or (config.layer_config or {}).get("intermediate_size")
    mlp = f"MLP width {width}" if width else "the base's MLP width"
    if config.head_type == "medusa":
        kind = (
            f"{config.num_heads} independent Medusa heads (Cai et al. 2023): the k-th guesses the k-th token after "
            f"the base's next one from the base's last hidden state alone, through {blocks} per head"
        )
    elif config.head_type == "recurrent":
        kind = (
            "one recurrent drafter shared by every depth (after ReDrafter and Hydra): a state starts at the base's "
            f"last hidden state and advances one drafted token at a time, then {blocks}; drafts {config.num_heads} "
            "deep"
        )
    elif config.head_type == "eagle":
        decoder = "Llama layers of its own config" if config.layer_config else "of the base's own architecture"
        kind = (
            f"an EAGLE head (EAGLE-1/2 architecture): a decoder of {layers} {decoder} ({mlp}) that drafts the base's "
            f"next features autoregressively, with its own KV cache; drafts {config.num_heads} deep by default"
        )
    else:
        layers = config.feature_layers or ["2", "L // 2", "L - 3"]
        fused = ", ".join(map(str, layers[:-1])) + f" and {layers[-1]}" if len(layers) > 1 else str(layers[0])
        style = "Qwen3" if (config.layer_config or {}).get("model_type") == "qwen3" else "Llama-style"
        variants = [name for name in EAGLE3_VARIANTS if getattr(config, name)]
        kind = (
            f"an EAGLE-3 head: one {style} layer ({mlp}) over the fusion of the base's hidden states {fused} "
            f"(indices of `output_hidden_states`), with its own final norm; drafts {config.num_heads} deep by default"
            + (f"; vLLM's variant options {', '.join(variants)}" if variants else "")
        )
    if config.head_type == "eagle3":
        projection = "its own lm_head"
    elif config.share_lm_head:
        projection = "the base's lm_head (no weights of its own)"
    else:
        projection = "its own projection" if config.head_type != "medusa" else "a projection of its own per head"
    if config.head_type in ("eagle", "eagle3"):
        tree = "grown per row and step from the head's own confidences (a dynamic tree)"
    else:
        tree = str(config.tree) if config.tree is not None else f"the preset medium, cut to {config.num_heads} deep"
    return [
        f"- head type: `{config.head_type}`, {kind}",
        f"- projection: {projection}; draft vocabulary: {vocabulary}",
        f"- tree: {tree}",
    ]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


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
        f"# {HEAD_NAMES[config.head_type]} for {base}",
        "",
        f"A drafter for lossless speculative decoding with `{LIBRARY_NAME}` on {base}: the "
        "base verifies every drafted token, so outputs are the base's own.",
        "",
        *head_structure(config),
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
    column = "head" if config.head_type == "medusa" else "depth"
    header = "| | " + " | ".join(f"{column} {k + 1}" for k in range(len(config.measured_top1))) + " |"
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
        tree = "the stored tree" if config.head_type in ("medusa", "recurrent") else "the best static tree"
        rows += ["", f"Expected tokens per step (tau) of {tree} for these accuracies: {tau}."]
    return rows
