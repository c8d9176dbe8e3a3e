"""What the processes of a distributed run (`accelerate launch`, `torchrun`) must agree on."""

from __future__ import annotations

from typing import TypeVar

from accelerate import PartialState

T = TypeVar("T")


def main_process_value(value: T) -> T:
    """The main process's `value`, on every process (e.g. the name of a folder they all write into, when it is
    derived from a `datasets` fingerprint that a process could compute differently). `value` as is when the run
    has one process."""
    if PartialState().num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]
