"""docs/refusals.md is what the code raises: regenerated here, it equals the page byte for byte. And what the page
promises holds: every case of `tests/refusal_cases.py`, on every path it applies to, is refused with a `ValueError`
or `TypeError` with a message, before any decoding step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from transformers import GenerationMixin

from tests.refusal_cases import CASES, TABLE_PATHS, TOPICS, Case, Models

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "refusals.md"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("refusal_table", ROOT / "tools" / "refusal_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


@pytest.fixture(scope="module")
def models() -> Models:
    return Models()


@pytest.fixture(scope="module")
def rows(models: Models) -> list[Any]:
    """The page's rows as the code makes them now."""
    refusals, problems = tool.refuse_all(models)
    assert not problems, "calls not refused as docs/refusals.md promises:\n" + "\n".join(problems)
    return tool.rows(refusals)


def test_the_cases_are_well_formed() -> None:
    assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"
    for case in CASES:
        assert case.topic in TOPICS, case.id
        assert case.paths and set(case.paths) <= set(TABLE_PATHS), case.id
        assert len(set(case.paths)) == len(case.paths), case.id
        assert case.what.strip() and "\n" not in case.what, case.id


@pytest.mark.parametrize(("case", "path"), [pytest.param(c, p, id=f"{c.id}-{p}") for c in CASES for p in c.paths])
def test_every_case_is_refused_before_decoding(models: Models, case: Case, path: str) -> None:
    steps: list[str] = []

    def count(module: torch.nn.Module, args: Any) -> None:
        if isinstance(module, GenerationMixin):
            steps.append(type(module).__name__)

    hook = register_module_forward_pre_hook(count)
    try:
        with pytest.raises((ValueError, TypeError)) as error:
            case.call(models, path)
    finally:
        hook.remove()
    assert str(error.value).strip(), f"{type(error.value).__name__} without a message"
    assert not steps, f"refused only after a forward of {steps}"


def test_the_page_is_what_the_code_raises(rows: list[Any]) -> None:
    expected = tool.render(rows)
    written = PAGE.read_text() if PAGE.exists() else ""
    assert written == expected, (
        "docs/refusals.md does not match what the code raises: regenerate it with `python tools/refusal_table.py`"
    )


def test_the_page_renders_every_message_as_raised(rows: list[Any]) -> None:
    """Each table row has its four cells, and the message cell reads as the message (pipes, brackets and
    backticks escaped where Markdown would take them for markup)."""
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(tool.render(rows))
    cells: list[list[str]] = []
    in_body = False
    for token in tokens:
        if token.type in ("tbody_open", "tbody_close"):
            in_body = token.type == "tbody_open"
        elif in_body and token.type == "tr_open":
            cells.append([])
        elif in_body and token.type == "inline":
            parts = token.children or []
            cells[-1].append("".join(f"`{p.content}`" if p.type == "code_inline" else p.content for p in parts))
    table = cells[len(TABLE_PATHS) :]  # after the table of paths
    assert len(table) == len(rows)
    for row, rendered in zip(rows, table, strict=True):
        assert len(rendered) == 4, rendered
        assert rendered[3] == row.message


@pytest.mark.parametrize(
    ("text", "markdown"),
    [
        ("plain words", "plain words"),
        ("`a|b` or c|d", r"`a\|b` or c\|d"),
        ("got [1, 2] <= 3", r"got \[1, 2\] \<= 3"),
        ("num_assistant_tokens, _private_, a*b", r"num_assistant_tokens, \_private\_, a\*b"),
        ("one ` backtick", r"one \` backtick"),
        ("two\nlines", "two lines"),
    ],
)
def test_cells_escape_markdown(text: str, markdown: str) -> None:
    assert tool.cell(text) == markdown
