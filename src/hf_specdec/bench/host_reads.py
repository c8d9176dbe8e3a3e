"""Count the times the host reads a tensor's values while code runs: on a GPU, each such read waits for every
kernel queued before it, so a decoding step that reads often cannot keep the device busy.

What counts as a read, wherever the tensor lives (on a CPU nothing waits, but the same code on a GPU would):

- a tensor's value turned into a Python value: `.item()`, `bool(t)`, `int(t)`, `float(t)`, `.tolist()`,
  `.numpy()`, and a copy to the host, `.cpu()` (whatever device the tensor is on: the code is the same on a GPU);
- operations whose output size depends on the values: `nonzero`, `unique`, `masked_select`, indexing with a
  boolean mask, `repeat_interleave` with tensor repeats.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operators whose result's shape depends on the values of an input (the host must read them to size it).
_DATA_DEPENDENT = {
    "aten::nonzero",
    "aten::unique_consecutive",
    "aten::unique_dim",
    "aten::_unique2",
    "aten::_unique",
    "aten::masked_select",
    "aten::_local_scalar_dense",
}
_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _site() -> str:
    """The innermost line of this package outside this module that is running: where a read was asked for."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE) and name != __file__:
            return f"{os.path.relpath(name, _PACKAGE)}:{frame.f_lineno}"
        frame = frame.f_back
    return "outside hf_specdec"


class _DataDependentOps(TorchDispatchMode):
    def __init__(self, counts: Counter[str], paused: Callable[[], bool], sites: Counter[str] | None) -> None:
        super().__init__()
        self.counts = counts
        self.paused = paused
        self.sites = sites

    def _count(self, kind: str) -> None:
        self.counts[kind] += 1
        if self.sites is not None:
            self.sites[_site()] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func._schema.name
        if not self.paused():
            if name in _DATA_DEPENDENT:
                self._count(name.removeprefix("aten::"))
            elif name in ("aten::index.Tensor", "aten::index_put_", "aten::index_put") or name.startswith(
                "aten::index"
            ):
                indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
                if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                    self._count("boolean mask indexing")
            elif name == "aten::repeat_interleave.Tensor":
                self._count("repeat_interleave")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_host_reads(sites: Counter[str] | None = None) -> Iterator[Counter[str]]:
    """Count host reads (see the module's docstring) made while the block runs, by kind, in this thread.

    Args:
        sites (`Counter`, *optional*): also counts each read under the line of this package that asked for it
            (`"generation/loop.py:212"`), to find where a step reads.

    Example:
        >>> with count_host_reads() as reads:
        ...     model.generate(...)
        >>> sum(reads.values())
    """
    counts: Counter[str] = Counter()
    state = threading.local()
    state.depth = 0
    owner = threading.get_ident()

    def paused() -> bool:
        return threading.get_ident() != owner or getattr(state, "depth", 0) > 0

    originals = {name: getattr(torch.Tensor, name) for name in _METHODS}

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if paused():
                return original(self, *args, **kwargs)
            counts[name.strip("_")] += 1
            if sites is not None:
                sites[_site()] += 1
            state.depth = getattr(state, "depth", 0) + 1  # a read is one read, whatever it dispatches inside
            try:
                return original(self, *args, **kwargs)
            finally:
                state.depth -= 1

        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(name, original))
    try:
        with _DataDependentOps(counts, paused, sites):
            yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
