"""The host-read counter: what it counts as a read a GPU would wait for, and what it leaves alone."""

from __future__ import annotations

import threading

import torch

from hf_specdec.bench.host_reads import count_host_reads


def test_each_kind_of_read_is_counted_once() -> None:
    x = torch.arange(6)
    with count_host_reads() as reads:
        x.sum().item()
        bool(x.any())
        int(x[0])
        x.tolist()
        x.nonzero()
        x[x > 2]
        x.unique()
    assert reads["item"] == reads["bool"] == reads["int"] == reads["tolist"] == 1
    assert reads["nonzero"] == 1 and reads["boolean mask indexing"] == 1 and sum(reads.values()) == 7


def test_device_work_alone_is_not_a_read() -> None:
    x = torch.randn(4, 8)
    with count_host_reads() as reads:
        y = torch.softmax(x @ x.T, dim=-1).argmax(dim=-1)
        torch.where(y > 1, y, 0).cumsum(0)
        x.masked_fill(x > 0, 0.0)
    assert sum(reads.values()) == 0


def test_other_threads_and_the_time_after_are_not_counted() -> None:
    x = torch.ones(3)
    with count_host_reads() as reads:
        thread = threading.Thread(target=lambda: x.sum().item())
        thread.start()
        thread.join()
    x.sum().item()
    assert sum(reads.values()) == 0
