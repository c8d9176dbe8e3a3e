"""Every `python` block of docs/usage.md runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

DOCS = Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text())


def test_usage_page_has_examples() -> None:
    assert len(python_blocks(DOCS / "usage.md")) >= 3


@pytest.mark.real_model
def test_usage_examples_run(monkeypatch) -> None:
    """The page's compiled example compiles with dynamo's eager backend here: the graphs, guards and static shapes
    are what the example shows; inductor's code generation for a 30-layer model would take minutes on this CPU,
    and tests/test_static_cache.py runs it on tiny models."""
    compile_with_inductor = torch.compile

    def compile_eagerly(model=None, **options):
        options = {k: v for k, v in options.items() if k not in ("backend", "mode", "options")}
        return compile_with_inductor(model, backend="eager", **options)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    monkeypatch.chdir(DOCS.parent)  # the page's paths are relative to the repository's root
    namespace: dict = {}
    for block in python_blocks(DOCS / "usage.md"):
        exec(compile(block, str(DOCS / "usage.md"), "exec"), namespace)
