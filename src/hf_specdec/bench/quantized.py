"""An int8 copy of the draft model, for the benchmark's `specdec-int8` methods.

On a CPU a forward at batch 1 costs about what reading the model's weights costs, so a draft with int8 weights
costs about half of a bf16 one (Qwen2.5-Coder-0.5B on this project's CPU: 53 ms a token against 107 ms). This is
what a user does to their own draft before passing it as `assistant=`: torch's dynamic quantisation of every
linear layer (int8 weights, activations quantised on the fly, float32 outside the linear layers). The draft
changes, the target does not: greedy keeps plain greedy's tokens and sampling the target's distribution.
"""

from __future__ import annotations

import copy
import warnings

import torch
from transformers import PreTrainedModel

from hf_specdec.cpu_linears import unpack_linears


def int8_draft(draft: PreTrainedModel) -> PreTrainedModel:
    """A copy of `draft` (on the CPU) whose linear layers, its lm_head included, hold int8 weights:
    `torch.ao.quantization.quantize_dynamic` over a float32 copy."""
    if draft.device.type != "cpu":
        raise ValueError(
            f"The int8 draft uses torch's dynamic quantisation, which runs on CPUs; the draft is on {draft.device}. "
            "Drop the specdec-int8 methods, or benchmark on the CPU (--device cpu)."
        )
    float_copy = copy.deepcopy(draft).float().eval()
    unpack_linears(float_copy)  # quantize_dynamic converts nn.Linear layers only
    with warnings.catch_warnings():
        # torch.ao's quantised tensors are deprecated in favour of torchao, whose int8 layers run 2-5x slower than
        # these on this CPU without torch.compile (torchao 0.18, torch 2.13).
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(float_copy, {torch.nn.Linear}, dtype=torch.qint8)
