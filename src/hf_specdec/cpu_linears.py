"""Linear layers through oneDNN on a CPU: `pack_linears`.

On a CPU, torch computes a float32 `nn.Linear` with MKL's matrix products, which read the whole weight matrix once
per row of a small input: verifying two tokens costs about twice what one costs, and three or more about three
times (a 1536 x 8960 layer on a 2-core AMD EPYC with AVX2: 3.4 ms for one row, 6.9 ms for two, 11 ms for three to
nine). That is the cost structure speculative decoding cannot win against: every draft it verifies costs nearly a
decoding step. oneDNN's matrix products over weights packed for them once (torch's own `mkldnn` operators, the
ones inductor uses for frozen CPU models) read the weights once for any small number of rows: 2.3 ms for one row,
1.9 to 3.4 ms for two to nine on the same layer, so plain decoding gets faster and a speculative step verifies
several tokens for about the price of one.

The packed copy is kept beside each layer's weights (about as much memory again for those layers; `packed=False`
runs oneDNN over the weights as they are, with no copy, at about half the gain), made at the layer's first forward
and again whenever its weights change. Forwards that need gradients run `torch.nn.functional.linear` as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PackedLinear(nn.Linear):
    """An `nn.Linear` (the same parameters and state dict) whose inference forwards run oneDNN's matrix product
    over its weights packed once (`pack_linears`); a class an `nn.Linear` is switched to in place, never built."""

    packed: bool
    _pack: torch.Tensor | None
    _pack_version: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (self.weight.requires_grad or input.requires_grad):
            return F.linear(input, self.weight, self.bias)  # the oneDNN operator has no backward
        rows = input.reshape(-1, input.shape[-1]).contiguous()
        output = torch.ops.mkldnn._linear_pointwise(rows, self._weights(), self.bias, "none", [], "")
        return output.reshape(*input.shape[:-1], self.out_features)

    def _weights(self) -> torch.Tensor:
        """The weights oneDNN reads: packed once, and again after anything changed them in place."""
        if not self.packed:
            return self.weight
        if self._pack is None or self._pack_version != self.weight._version:
            self._pack = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
            self._pack_version = self.weight._version
        return self._pack

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weights out (oneDNN's packed tensors cannot be copied): packed again
        at their first forward."""
        return {**super().__getstate__(), "_pack": None}


def pack_linears(model: nn.Module, packed: bool = True) -> int:
    """Run the float32 `nn.Linear` layers of `model`, on a CPU, through oneDNN's matrix products (see the module's
    docstring): in place, for inference (`generate()`); parameters, state dict and `save_pretrained` unchanged.
    Outputs change by float rounding only (a different order of summation, as between any two matrix-product
    libraries): compare speculative decoding with plain decoding of the same packed model.

    Args:
        model (`nn.Module`): a model on the CPU with float32 linear layers (a target, a draft model, heads).
        packed (`bool`, *optional*, defaults to `True`): keep a copy of each layer's weights in oneDNN's packed
            layout (faster; as much memory again for those layers); `False` reads the weights as they are.

    Returns:
        `int`: how many layers now run through oneDNN (layers of other dtypes or types are left as they are).

    Raises:
        `RuntimeError`: torch was built without oneDNN or its linear operators.
        `ValueError`: the model has no float32 `nn.Linear` on the CPU (load it with `dtype=torch.float32`).
    """
    operators = ("_linear_pointwise", "_reorder_linear_weight")
    if not torch.backends.mkldnn.is_available() or not all(hasattr(torch.ops.mkldnn, op) for op in operators):
        raise RuntimeError(
            f"pack_linears needs torch built with oneDNN and its operators {', '.join(operators)} (torch "
            f"{torch.__version__} here has not both): install torch's own CPU build "
            "(https://pytorch.org/get-started/locally/) or leave the layers as they are."
        )
    layers = [m for m in model.modules() if type(m) in (nn.Linear, PackedLinear)]
    usable = [m for m in layers if m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
    if not usable:
        kinds = sorted({f"{m.weight.dtype} on {m.weight.device.type}" for m in layers}) or ["no nn.Linear"]
        raise ValueError(
            f"pack_linears runs float32 nn.Linear layers on a CPU; this model has {', '.join(kinds)}: load it with "
            "dtype=torch.float32 on the CPU, or leave it as it is."
        )
    for layer in usable:
        layer.__class__ = PackedLinear
        layer.packed, layer._pack, layer._pack_version = packed, None, -1
    return len(usable)


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: the layers run `nn.Linear`'s forward again (and their packed copies are freed); returns
    how many."""
    layers = [m for m in model.modules() if type(m) is PackedLinear]
    for layer in layers:
        del layer.packed, layer._pack, layer._pack_version
        layer.__class__ = nn.Linear
    return len(layers)
