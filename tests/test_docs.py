"""Every `python` block of docs/usage.md runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text())


def test_usage_page_has_examples() -> None:
    assert len(python_blocks(DOCS / "usage.md")) >= 3


@pytest.mark.real_model
def test_usage_examples_run() -> None:
    namespace: dict = {}
    for block in python_blocks(DOCS / "usage.md"):
        exec(compile(block, str(DOCS / "usage.md"), "exec"), namespace)
