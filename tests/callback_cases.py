"""What the streamer and stopping-criteria tests share: a tiny Llama target with its one-layer draft and Medusa heads,
every speculative path's arguments, and a streamer that records its calls."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

import hf_specdec
from tests.tiny_models import tiny_model, tiny_target


class Recording(BaseStreamer):
    """Records every call, as lists."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls.append(value.tolist())

    def end(self) -> None:
        self.calls.append("end")


@functools.cache
def models() -> tuple[Any, Any, Any]:
    """(target, draft, heads on the target), built once."""
    target = tiny_target("llama")
    heads = hf_specdec.MedusaForCausalLM.from_base(target, hf_specdec.MedusaConfig(num_heads=2))
    return target, tiny_model("llama", seed=1, num_layers=1), heads


# Each path's `generate()` arguments, given the draft ("heads": call the heads' model).
PATHS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "assistant": lambda draft: {"assistant": draft},
    "tree": lambda draft: {"assistant": draft, "tree": 4},
    "lookup": lambda draft: {"prompt_lookup_num_tokens": 3},
    "assistant+lookup": lambda draft: {"assistant": draft, "prompt_lookup_num_tokens": 3},
    "heads": lambda draft: {"medusa": True},
}
