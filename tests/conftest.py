"""Shared test settings."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n auto`), each worker gets its share of the cores, so that workers running real models
    side by side do not each start a thread per core and wait on each other (the commands tests start get the same
    share through `OMP_NUM_THREADS`, unless it is set)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `vllm` build a vLLM environment (minutes, gigabytes): they run only when `-m` asks for them."""
    if "vllm" in (config.getoption("markexpr") or "").replace("not vllm", ""):
        return
    skip = pytest.mark.skip(reason="serves heads in vLLM: select with -m vllm")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _threads_for_tiny_models(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tiny models run fastest on one thread (two threads mostly wait on each other on a busy 2-core machine);
    real models keep torch's default."""
    if request.node.get_closest_marker("real_model") is not None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _cold_costs() -> Iterator[None]:
    """Each test starts with no costs measured by earlier calls (`decisions.memory`): what a test asserts must not
    depend on which tests ran before it in the same process."""
    from hf_specdec.generation.decisions import forget_measured_costs

    forget_measured_costs()
    yield
