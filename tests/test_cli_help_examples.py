"""Every example a subcommand's `--help` prints runs as printed (the cheap ones here: those that load no model)."""

from __future__ import annotations

import re
import shlex

import pytest

from hf_specdec.cli import build_parser, main

# Subcommands whose examples load models or data: their arguments are checked by parsing only.
HEAVY = {"demo", "bench", "gpu", "data", "export", "overhead"}


def _examples() -> list[tuple[str, str]]:
    subcommands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    found = []
    for name, parser in subcommands.items():
        text = (parser.description or "") + "\n" + (parser.epilog or "")
        found += [(name, line) for line in re.findall(r"^\s+(hf-specdec .+)$", text, re.MULTILINE)]
    return found


def test_some_help_prints_examples() -> None:
    assert any(name == "simulate" for name, _ in _examples())


@pytest.mark.parametrize(("name", "line"), _examples())
def test_a_help_example_runs_as_printed(name: str, line: str, capsys) -> None:
    argv = shlex.split(line)[1:]
    if name in HEAVY:
        build_parser().parse_args(argv)  # the example's arguments at least parse
        return
    assert main(argv) == 0
    assert capsys.readouterr().out.strip()
