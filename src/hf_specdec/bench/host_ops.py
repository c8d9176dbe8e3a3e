"""Count the tensor operations the host dispatches outside model forwards while code runs.

On a CPU, or on a GPU whose host is the bottleneck (small models, small batches), every operation the decoding
loop dispatches around the forwards costs the host a few microseconds: building masks, bookkeeping, acceptance.
Their number is a machine-independent measure of that overhead, beside host time (which varies with the machine
and its load): `hf-specdec overhead` prints both per generated token.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


class _Operations(TorchDispatchMode):
    def __init__(self, inside: list[int]) -> None:
        super().__init__()
        self.inside = inside
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self.inside[0] == 0:
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_host_ops() -> Iterator[list[int]]:
    """Count the operations (ATen calls, views included) dispatched in this thread outside any `nn.Module`
    forward while the block runs; yields `[count]`, final when the block ends."""
    inside, thread = [0], threading.get_ident()

    def enter(module: nn.Module, args: Any) -> None:
        if threading.get_ident() == thread:
            inside[0] += 1

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() == thread:
            inside[0] -= 1

    handles = [
        nn.modules.module.register_module_forward_pre_hook(enter),
        nn.modules.module.register_module_forward_hook(leave),
    ]
    result = [0]
    try:
        with _Operations(inside) as mode:
            yield result
    finally:
        for handle in handles:
            handle.remove()
    result[0] = mode.count
