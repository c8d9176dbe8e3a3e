"""Linear layers through oneDNN on a CPU: `pack_linears`.

On a CPU, torch computes a float32 `nn.Linear` with MKL's matrix products, which read the whole weight matrix once
per row of a small input: verifying two tokens costs more than twice what one costs, and three or more three to
five times (an 8960 x 1536 layer on a 2-core AMD EPYC with AVX2: 2.9 ms for one row, 6.7 ms for two, 9.6 to 14.1
ms for three to seventeen; `tools/linear_rows.py`). That is the cost structure speculative decoding cannot win
against: every draft it verifies costs nearly a decoding step. oneDNN's matrix products (torch's own `mkldnn`
operators) over weights packed for them once read the weights once for a few rows: 2.3 ms for one row, 2.2 to 3.5
ms for two to five on the same layer, so plain decoding gets faster and a speculative step verifies several
tokens for about the price of one.

The packed copy is kept beside each layer's weights (as much memory again for those layers; `packed=False` runs
oneDNN over the weights as they are, with no copy, slower for a few rows), made at the layer's first forward and
again when its weights are replaced (another tensor, whatever its address), moved, or changed in place: through
their version counter, and, for changes it does not count (under `torch.inference_mode()`, through `.data` as
PEFT's adapter merges write), through a sample of the weights compared at every forward (`SAMPLE` of them, spread
over the matrix: a change of a few weights that misses them all is not seen; call `pack_linears` again after one).
Forwards that need gradients, inputs other than float32 on the CPU, and layers with a parametrized weight (computed
anew at every access) run `torch.nn.functional.linear` as before.
"""

from __future__ import annotations

import functools
import platform
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

# Weights of a layer compared at every forward with those its packed copy was made from.
SAMPLE = 64


class PackedLinear(nn.Linear):
    """An `nn.Linear` (the same parameters and state dict) whose inference forwards run oneDNN's matrix product
    over its weights packed once (`pack_linears`); a class an `nn.Linear` is switched to in place, never built."""

    packed: bool
    _pack: torch.Tensor | None
    _pack_key: tuple | None  # (a weak reference to the weights packed, their address and version, a sample)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._onednn_runs(input):
            return F.linear(input, self.weight, self.bias)
        rows = input.reshape(-1, input.shape[-1]).contiguous()
        output = torch.ops.mkldnn._linear_pointwise(rows, self._weights(), self.bias, "none", [], "")
        return output.reshape(*input.shape[:-1], self.out_features)

    def _onednn_runs(self, input: torch.Tensor) -> bool:
        """Whether this forward goes through oneDNN: float32 on the CPU, some rows, no gradient to compute (the
        oneDNN operator has no backward)."""
        tensors = (input, self.weight) if self.bias is None else (input, self.weight, self.bias)
        if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
            return False
        if input.dim() == 0 or input.numel() == 0 or parametrize.is_parametrized(self):
            return False
        return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))

    def _weights(self) -> torch.Tensor:
        """The weights oneDNN reads: packed once, and again after they were replaced or changed in place."""
        if not self.packed:
            return self.weight
        weight = self.weight
        try:
            version = weight._version
        except RuntimeError:  # made under torch.inference_mode(): no version counter (the sample tells)
            version = -1
        sample = _sample(weight)
        key = self._pack_key
        if (
            self._pack is None
            or key is None
            or key[0]() is not weight
            or key[1] != (weight.data_ptr(), version)
            or not torch.equal(key[2], sample)
        ):
            self._pack = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self._pack_key = (weakref.ref(weight), (weight.data_ptr(), version), sample)
        return self._pack

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> PackedLinear:
        """`.to()`, `.float()`, `.cuda()` and the like drop the packed copy: packed again where it still applies."""
        self._pack = self._pack_key = None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weights out (oneDNN's packed tensors cannot be copied): packed again
        at their first forward."""
        return {**super().__getstate__(), "_pack": None, "_pack_key": None}


def _sample(weight: torch.Tensor) -> torch.Tensor:
    """A copy of `SAMPLE` of a matrix's entries, at places spread over its rows and columns (every entry of a
    small one)."""
    flat = weight.detach().reshape(-1)
    return flat[_sample_places(flat.numel(), flat.device)]


@functools.lru_cache(maxsize=256)
def _sample_places(numel: int, device: torch.device) -> torch.Tensor:
    """`SAMPLE` fixed places among `numel` entries, drawn once per size: a stride would fall in one column of most
    matrices (their sizes are multiples of 64)."""
    if numel <= SAMPLE:
        return torch.arange(numel, device=device)
    generator = torch.Generator().manual_seed(numel)
    return torch.randint(numel, (SAMPLE,), generator=generator).to(device)


def packs_by_default() -> bool:
    """Whether the library's commands pack float32 linear layers unless told otherwise: where the operators run and
    the CPU is an x86 one (where the gain was measured)."""
    return platform.machine().lower() in ("x86_64", "amd64") and can_pack_linears()


@functools.cache
def can_pack_linears() -> bool:
    """Whether this torch can run `pack_linears`' layers: built with oneDNN, with its linear operators taking
    dense CPU tensors (tried once on a tiny layer)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.ones(2, 3)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        output = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 3), packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return bool(torch.equal(output, torch.full((2, 2), 3.0)))


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
        `RuntimeError`: this torch build cannot run oneDNN's linear operators over dense weights
            (`can_pack_linears()` is `False`).
        `ValueError`: the model has no float32 `nn.Linear` on the CPU (load it with `dtype=torch.float32`).
    """
    if not can_pack_linears():
        raise RuntimeError(
            f"pack_linears needs torch's oneDNN linear operators (mkldnn::_linear_pointwise over weights packed by "
            f"mkldnn::_reorder_linear_weight), which this torch build ({torch.__version__}) does not run: leave the "
            "layers as they are."
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
        layer.packed, layer._pack, layer._pack_key = packed, None, None
    return len(usable)


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: the layers run `nn.Linear`'s forward again (and their packed copies are freed); returns
    how many."""
    layers = [m for m in model.modules() if type(m) is PackedLinear]
    for layer in layers:
        del layer.packed, layer._pack, layer._pack_key
        layer.__class__ = nn.Linear
    return len(layers)
