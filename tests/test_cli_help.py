"""`--help` of every `hf-specdec` subcommand shows each option's default, the zoo names a model option takes, and, for
`bench`, every method the benchmark accepts (the names and the patterns `hf_specdec.bench.methods` defines)."""

from __future__ import annotations

import argparse
import re

import pytest

from hf_specdec.bench import cli as bench_cli
from hf_specdec.bench.cli import methods as bench_methods
from hf_specdec.bench.methods import METHODS, PATTERNS, method_by_name, method_names
from hf_specdec.cli import build_parser, main
from hf_specdec.cli_args import model_source
from hf_specdec.zoo import ZOO

SUBCOMMANDS: dict[str, argparse.ArgumentParser] = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
MODEL_TYPES = (model_source, bench_cli._draft_source)
# What the patterns' letters stand for in the examples below.
NUMBERS = {"N": "12", "D": "4", "K": "3"}


@pytest.fixture(autouse=True)
def _wide_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no value is cut where it wraps


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.option_strings and action.dest != "help"]


def _has_default(action: argparse.Action) -> bool:
    return action.default not in (None, False, argparse.SUPPRESS)


def _example(pattern: str) -> str:
    """`pattern` with its letters replaced by numbers: `medusa-dynN` -> `medusa-dyn12`."""
    return re.sub(r"[NDK]", lambda match: NUMBERS[match.group()], pattern)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_option_with_a_default_shows_it(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = SUBCOMMANDS[command]
    text = _help(command, capsys)
    for action in _options(parser):
        if not _has_default(action):
            continue
        line = " ".join(parser._get_formatter()._expand_help(action).split())
        assert "default" in line and str(action.default) in line, f"{command} {action.option_strings[0]}: {line}"
        assert line in " ".join(text.split()), f"{command} {action.option_strings[0]}: {line}"
    assert "(default: None)" not in text and "(default: False)" not in text


def test_every_subcommand_has_options_with_defaults_shown(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("demo", "bench", "overhead", "gpu", "data", "simulate", "export"):
        assert "(default: " in _help(command, capsys), command


def test_every_model_option_lists_the_zoo_names(capsys: pytest.CaptureFixture[str]) -> None:
    found = []
    for command, parser in SUBCOMMANDS.items():
        text = _help(command, capsys)
        for action in _options(parser):
            if action.type in MODEL_TYPES:
                line = " ".join(parser._get_formatter()._expand_help(action).split())
                assert all(name in line for name in ZOO), f"{command} {action.option_strings[0]}: {line}"
                assert line in " ".join(text.split())
                found.append(f"{command} {action.option_strings[0]}")
    assert {"demo --target", "demo --draft", "bench --target", "bench --draft", "export --base"} <= set(found)


def test_bench_help_lists_every_method_and_every_pattern(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help("bench", capsys)
    methods_line = next(line for line in text.splitlines() if line.lstrip().startswith("--methods"))
    for name in method_names():
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", methods_line), name
    for pattern, meaning in PATTERNS.items():  # and what each pattern runs, below the options
        assert re.search(rf"^\s+{re.escape(pattern)}\s+{re.escape(meaning)}$", text, re.MULTILINE), pattern
    assert set(method_names()) == set(METHODS) | set(PATTERNS)


@pytest.mark.parametrize("pattern", [*PATTERNS, "specdec-treeN-dD", "specdec-treeN-kK", "specdec-treeN-dD-kK-vocab"])
def test_every_pattern_names_a_method_the_benchmark_runs(pattern: str) -> None:
    name = _example(pattern)
    assert not re.search(r"[NDK]", name), name
    method = method_by_name(name)
    assert method.name == name
    args = build_parser().parse_args(["bench", "--draft", "none", "--methods", f"plain,{name}"])
    assert [m.name for m in bench_methods(args)] == ["plain", name]


def test_the_patterns_cover_every_kind_of_patterned_method() -> None:
    kinds = {method_by_name(_example(pattern)).uses for pattern in PATTERNS}
    assert kinds == {"medusa", "specdec", "early-exit", "hf-early-exit"}
    named = {method_by_name(_example(pattern)).name for pattern in PATTERNS}
    assert not named & set(METHODS)  # every pattern names methods beyond the fixed ones


def test_an_unknown_method_is_answered_with_the_patterns() -> None:
    with pytest.raises(ValueError, match="Unknown method") as error:
        method_by_name("warp-drive")
    assert all(pattern in str(error.value) for pattern in PATTERNS)
