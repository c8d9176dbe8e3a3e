"""Real code as training text: the Python files of an environment, chunked at line ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_specdec.cli import main
from hf_specdec.code_corpus import chunks, code_records, python_roots


@pytest.mark.parametrize("max_chars", [1, 7, 40, 1000])
def test_chunks_cut_at_line_ends_and_lose_nothing_but_blank_pieces(max_chars: int) -> None:
    text = "def f(x):\n    return x + 1\n\n\n" + "y = 'a long line that runs on and on'\n" * 5 + "\n"
    pieces = list(chunks(text, max_chars))
    assert all(0 < len(p) <= max_chars and p.strip() for p in pieces)
    assert "".join("".join(pieces).split()) == "".join(text.split())  # every character kept but blank pieces
    if max_chars >= 40:
        assert all(p.endswith("\n") for p in pieces)  # lines fit: every cut is at a line end


def _tree(root: Path) -> None:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("import os\n" * 30)  # 300 characters
    (root / "pkg" / "b.py").write_text("x = 1\n")  # too short
    (root / "pkg" / "__pycache__" / "c.py").write_text("cached = 1\n" * 40)
    (root / "pkg" / "d.py").write_text("é = 'ééé'\n" * 40)  # mostly not ASCII
    (root / "pkg" / "e.py").write_bytes(b"\xff\xfe not utf-8\n" * 40)


def test_code_records_read_real_files_once_in_a_fixed_order(tmp_path: Path) -> None:
    _tree(tmp_path)
    records = list(code_records([tmp_path, tmp_path / "pkg"], n=10, max_chars=120, min_chars=100))
    assert {r["source"].split("#")[0] for r in records} == {"pkg/a.py"}  # skipped: short, cache, non-ASCII, bytes
    assert [r["text"] for r in records] == [("import os\n" * 12)] * 2  # 300 characters in chunks of 120
    assert records == list(code_records([tmp_path], n=10, max_chars=120, min_chars=100))
    assert len(list(code_records([tmp_path], n=1, max_chars=120, min_chars=100))) == 1
    anything = {r["source"] for r in code_records([tmp_path], n=10, max_chars=500, min_ascii=0.0)}
    assert anything == {"pkg/a.py#0", "pkg/d.py#0"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"n": 0}, "at least one"), ({"min_chars": 50, "max_chars": 10}, "min_chars <= max_chars"),
     ({"min_ascii": 2.0}, "share of characters")],
)  # fmt: skip
def test_code_records_check_their_arguments_at_once(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        code_records([], **{"n": 1, **arguments})


def test_python_roots_hold_this_environments_code() -> None:
    roots = python_roots()
    assert any((root / "pytest").is_dir() for root in roots)  # an installed package
    assert any((root / "json" / "__init__.py").is_file() for root in roots)  # the standard library


def test_data_command_exports_installed_code(tmp_path: Path, capsys) -> None:
    out = tmp_path / "code.jsonl"
    assert main(["data", "--source", "python", "--n", "3", "--max-chars", "500", "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 3 and all(len(r["text"]) <= 500 and r["source"].count("#") == 1 for r in written)
    assert "wrote 3 code chunks" in capsys.readouterr().out
    later = tmp_path / "later.jsonl"  # held out: the chunks after those
    assert (
        main(["data", "--source", "python", "--n", "2", "--skip", "2", "--max-chars", "500", "--out", str(later)]) == 0
    )
    held_out = [json.loads(line) for line in later.read_text().splitlines()]
    assert len(held_out) == 2 and held_out[0] == written[2]
