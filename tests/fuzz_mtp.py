"""The model fuzzer's targets with multi-token-prediction (MTP) layers, for its `mtp` path (`use_mtp=True`).

transformers 5.25 declares MTP layers (`num_mtp_layers`) on DeepSeek-V3 and Sarvam-MLA (latent attention),
GLM-4.5 MoE, Param2-MoE and Sarvam-MoE (GLM-4.5's model), ERNIE 4.5 MoE and Mellum (one MTP layer each; Mellum's
through a sliding window), and Inkling (hybrid layers, which speculative decoding refuses). No MTP checkpoint
installs here: the layers are built from the random target (`MtpModel`, sharing its embeddings, lm_head and
rotary embedding) with random weights of their own, and attached to it as loaded ones would be.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_layers import MtpModel

from hf_specdec.mtp.layers import attach_mtp

# How often the `mtp` path draws each architecture (the names of `fuzz_models.ARCHS`), relative.
MTP_WEIGHTS = {
    "deepseek_v3": 3,
    "glm4_moe": 3,
    "ernie4_5_moe": 2,
    "mellum": 2,
    "sarvam_mla": 1,
    "sarvam_moe": 1,
    "param2moe": 1,
    "inkling": 1,
}


def draw_mtp_options(rng: random.Random, arch: str, most: int, options: dict[str, Any]) -> None:
    """Draw into a model spec's `options` how many MTP layers it has (1 to `most`) and their random weights."""
    options["mtp_layers"] = rng.randint(1, most) if rng.random() < 0.7 else 1
    options["mtp_seed"] = rng.randint(0, 10**6)
    options["mtp_scale"] = rng.choice([0.05, 0.3, 0.3, 1.0])  # of the matrices; larger: drafts further off
    options["mtp_copy"] = rng.random() < 0.5
    if arch == "mellum":
        options["mtp_layer_type"] = rng.choice(["sliding_attention", "full_attention"])


def mtp_config_kwargs(arch: str, options: dict[str, Any]) -> dict[str, Any]:
    """The config fields that declare the spec's MTP layers."""
    layers = options.get("mtp_layers")
    if not layers:
        return {}  # the config's own default (DeepSeek-V3 declares one layer, never attached on other paths)
    kw: dict[str, Any] = {"num_mtp_layers": layers}
    if arch == "mellum":  # its MTP layer attends through the sliding window, or not
        kw["mtp_layer_types"] = [options.get("mtp_layer_type", "sliding_attention")] * layers
    return kw


def attach_random_mtp(model: PreTrainedModel, options: dict[str, Any]) -> None:
    """Build the spec's MTP layers from `model` with seeded random weights (`MtpModel` leaves the experts'
    uninitialised: every tensor is drawn), in the model's dtype, and attach them."""
    layers = options.get("mtp_layers")
    if not layers:
        return
    mtp = MtpModel(model, layers).eval()
    generator = torch.Generator().manual_seed(options["mtp_seed"])
    scale = min(options["mtp_scale"], 0.05) if options.get("mtp_copy") else options["mtp_scale"]
    with torch.no_grad():
        for parameter in mtp.layers.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1 + 0.1 * noise if parameter.dim() == 1 else scale * noise)
        if options.get("mtp_copy"):
            for layer in mtp.layers:
                _copy_the_token(layer.eh_proj.weight, bool(getattr(mtp.config, "mtp_hidden_states_first", False)))
    attach_mtp(model, mtp.to(model.dtype))


def _copy_the_token(weight: torch.Tensor, hidden_first: bool) -> None:
    """Make a layer's input projection pass its token's (normalised) embedding through: with the residual block
    a small change on top, the layer then predicts its token once more, which a target repeating a token (as
    tiny random models do) accepts, so that accepted chains and their bookkeeping are exercised too."""
    size = weight.shape[0]
    embedding = slice(size, 2 * size) if hidden_first else slice(0, size)
    weight[:, embedding] = torch.eye(size)
