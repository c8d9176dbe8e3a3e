"""Every `hf-specdec` subcommand answers bad input with one line on stderr and exit status 2, before any work starts;
a missing optional dependency is named with the extra that installs it; bugs keep their traceback."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hf_specdec import MedusaConfig
from hf_specdec.bench import cli as bench_cli
from hf_specdec.bench import demo, prompts
from hf_specdec.cli import main
from hf_specdec.zoo import ZOO

ROOT = os.geteuid() == 0  # root writes anywhere: a read-only folder refuses nothing


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`main(argv)` in-process: (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(argv: list[str], capsys, *fragments: str) -> str:
    """Assert `argv` ends with status 2 and one line on stderr holding every fragment; returns the line."""
    code, _, err = run_cli(argv, capsys)
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"hf-specdec {argv[0]}: error: " if argv else "hf-specdec"), err
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


class Recorder:
    """Stands in for a heavy function: records its calls and returns `value`."""

    def __init__(self, value: object = 0) -> None:
        self.calls: list[tuple] = []
        self.value = value

    def __call__(self, *args, **kwargs) -> object:
        self.calls.append(args)
        return self.value


@pytest.fixture(autouse=True)
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Recorder]:
    """Work in tmp_path, with an empty zoo cache, and every heavy function replaced by a recorder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "1000")  # --help on one line per option
    heavy = {"demo": Recorder(True), "bench": Recorder(0), "data": Recorder([])}
    monkeypatch.setattr(demo, "run_demo", heavy["demo"])
    monkeypatch.setattr(bench_cli, "run_bench", heavy["bench"])
    monkeypatch.setattr(prompts, "sharegpt_v3_conversations", heavy["data"])
    return heavy


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file.txt"
    path.write_text("not a folder\n")
    return path


@pytest.fixture
def heads(tmp_path: Path) -> Path:
    """A folder of heads (config only: enough for every check made before loading)."""
    folder = tmp_path / "heads"
    MedusaConfig(num_heads=2, base_model_name_or_path=str(tmp_path / "base")).save_pretrained(folder)
    return folder


@pytest.fixture
def medusa2_heads(heads: Path) -> Path:
    """Heads saved with LoRA adapters on their base (`base_adapter/`)."""
    (heads / "base_adapter").mkdir()
    (heads / "base_adapter" / "adapter_config.json").write_text("{}")
    return heads


# Malformed and out-of-range values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["demo", "--max-new-tokens", "0"], "--max-new-tokens: expected a whole number >= 1, got 0"),
        (["demo", "--num-assistant-tokens", "-3"], "--num-assistant-tokens"),
        (["demo", "--max-new-tokens", "ten"], "expected a whole number, got 'ten'"),
        (["demo", "--prompt", " "], "--prompt: expected some text"),
        (["demo", "--dtype", "int4"], "invalid choice: 'int4'"),
        (["bench", "--n", "-1"], "--n: expected a whole number >= 1, got -1"),
        (["bench", "--batch-size", "0"], "--batch-size"),
        (["bench", "--draft-vocab-size", "0"], "--draft-vocab-size"),
        (["bench", "--seed", "-2"], "--seed"),
        (["bench", "--methods", "specdec,plain"], "start with plain"),
        (["bench", "--methods", "plain,plain"], "listed twice"),
        (["bench", "--methods", "plain,warp-drive"], "Unknown method 'warp-drive'"),
        (["bench", "--prompts", "mt-bench,poems"], "unknown prompt categories ['poems']"),
        (["bench", "--device", "toaster"], "--device: expected a device"),
        (["data", "--n", "0", "--out", "x.jsonl"], "--n: expected a whole number >= 1, got 0"),
        (["data", "--skip", "-1", "--out", "x.jsonl"], "--skip"),
        (["data", "--min-ascii", "97", "--out", "x.jsonl"], "--min-ascii: expected a share in [0, 1]"),
        (["data", "--topic", "poetry", "--out", "x.jsonl"], "invalid choice: 'poetry'"),
        (["data", "--min-prompt-chars", "50", "--max-prompt-chars", "10", "--out", "x.jsonl"], "swap them"),
        (["data", "--source", "python", "--whole", "--out", "x.jsonl"], "--whole select conversations"),
        (["data", "--source", "python", "--max-prompt-chars", "9", "--out", "x.jsonl"], "use --max-chars with code"),
        (["data", "--source", "cobol", "--out", "x.jsonl"], "invalid choice: 'cobol'"),
        (["data", "--source", "python", "--max-chars", "50", "--out", "x.jsonl"], "use at least that"),
        (["data", "--max-chars", "500", "--out", "x.jsonl"], "add --source python, or drop it"),
        (["simulate", "--gamma", "1..x"], "--gamma: expected 4, 1,2,4 or 1..8"),
        (["simulate", "--gamma", "8..1"], "empty range"),
        (["simulate", "--gamma", "-1"], "expected whole numbers in 0..1024"),
        (["simulate", "--gamma", "1..100000000"], "expected whole numbers in 0..1024"),
        (["simulate", "--tree-sizes", "0"], "--tree-sizes"),
        (["simulate", "--alpha", "nan"], "--alpha: expected finite numbers"),
        (["simulate", "--alpha", "80"], "probability in [0, 1]"),
        (["simulate", "--cost-ratio", "-0.5"], "--cost-ratio: expected a finite number >= 0"),
        (["simulate", "--tree-probs", "{"], "--tree-probs: expected JSON"),
        (["simulate", "--tree-probs", "5"], "--tree-probs: expected a list of depths"),
        (["simulate", "--tree-probs", "[[0.5], []]"], "--tree-probs"),
        (["simulate", "--tree-probs", "[[1.5]]"], "must be a probability in [0, 1]"),
        (["simulate", "--monte-carlo", "0"], "--monte-carlo"),
        (["simulate", "--device", "h100"], "--target-params"),
        (["simulate", "--device", "h100", "--target-params=-7e9"], "--target-params: expected a finite number > 0"),
        (["simulate", "--device", "cpu", "--target-params", "1e9", "--bytes-per-param", "0"], "--bytes-per-param"),
        (["simulate", "--cost-curve", "1:2:3"], "--cost-curve"),
        (["export", "org/heads", "--to", "sglang", "--out", "o"], "invalid choice: 'sglang'"),
        (["export", "org/heads", "--to", "tgi", "--out", "o", "--base-name", ""], "--base-name: expected some text"),
    ],
)
def test_bad_values_are_refused_in_one_line(argv: list[str], fragment: str, capsys, sandbox) -> None:
    assert_refused(argv, capsys, fragment)
    assert not any(recorder.calls for recorder in sandbox.values())


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["translate"],
        ["demo", "--frobnicate"],
        ["bench", "--n"],
        ["export"],
        ["data"],
        ["simulate", "--json", "extra"],
    ],
)
def test_argparse_errors_are_one_line_too(argv: list[str], capsys) -> None:
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "error:" in err and "--help" in err


# Paths ------------------------------------------------------------------------------------------------------------


def test_missing_paths_are_refused(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "nowhere" / "model")
    assert_refused(["demo", "--target", missing], capsys, "does not exist", "a zoo model (")
    assert_refused(["bench", "--medusa", missing], capsys, "--medusa", "does not exist")
    assert_refused(["export", missing, "--to", "vllm", "--out", "o"], capsys, "argument heads", "does not exist")


def test_a_zoo_name_that_does_not_exist_is_refused_with_the_names(capsys) -> None:
    for argv in (["demo", "--target", "qwen-9b"], ["bench", "--draft", "llama-1b"]):
        line = assert_refused(argv, capsys, "does not exist")
        assert all(name in line for name in ZOO)
    assert_refused(["export", "org/heads", "--to", "vllm", "--out", "o", "--base", "tiny"], capsys, "--base")


def test_a_file_where_a_folder_is_expected(a_file: Path, heads: Path, capsys) -> None:
    assert_refused(["bench", "--out", str(a_file)], capsys, "--out", "is a file")
    assert_refused(["bench", "--medusa", str(a_file)], capsys, "--medusa", "is a file")
    assert_refused(["demo", "--draft", str(a_file)], capsys, "--draft", "is a file")
    assert_refused(["export", str(a_file), "--to", "tgi", "--out", "o"], capsys, "is a file")
    assert_refused(["export", str(heads), "--to", "tgi", "--out", str(a_file)], capsys, "--out", "is a file")
    assert_refused(["data", "--out", str(a_file / "x.jsonl")], capsys, "is a file, not a folder")


def test_a_folder_where_a_file_is_expected(tmp_path: Path, capsys) -> None:
    assert_refused(["data", "--out", str(tmp_path)], capsys, "--out", "is a folder")
    assert_refused(["simulate", "--plot", str(tmp_path)], capsys, "--plot", "is a folder")
    assert_refused(["simulate", "--plot", str(tmp_path / "speedup.txt")], capsys, "--plot", ".png")


def test_a_folder_without_heads_is_refused(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_refused(["bench", "--medusa", str(empty)], capsys, "--medusa", "holds no heads")
    assert_refused(["export", str(empty), "--to", "vllm", "--out", "o"], capsys, "holds no heads")


def test_heads_an_engine_cannot_serve_or_without_a_base_are_refused_before_loading(tmp_path: Path, capsys) -> None:
    recurrent = tmp_path / "recurrent"
    MedusaConfig(head_type="recurrent", base_model_name_or_path="org/base").save_pretrained(recurrent)
    assert_refused(["export", str(recurrent), "--to", "vllm", "--out", "o"], capsys, "serves Medusa heads only")
    baseless = tmp_path / "baseless"
    MedusaConfig().save_pretrained(baseless)
    assert_refused(["export", str(baseless), "--to", "vllm", "--out", "o"], capsys, "name no base: pass --base")


def _locked_folder(tmp_path: Path) -> Path:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked


def _cases_in(locked: Path, heads: Path) -> list[list[str]]:
    return [
        ["bench", "--out", str(locked / "results")],
        ["data", "--out", str(locked / "data.jsonl")],
        ["simulate", "--plot", str(locked / "deeper" / "speedup.png")],
        ["export", str(heads), "--to", "vllm", "--out", str(locked)],
    ]


@pytest.mark.skipif(ROOT, reason="root writes into read-only folders")
def test_unwritable_folders_are_refused(tmp_path: Path, heads: Path, capsys) -> None:
    locked = _locked_folder(tmp_path)
    try:
        for argv in _cases_in(locked, heads):
            assert_refused(argv, capsys, "is not writable")
    finally:
        locked.chmod(0o700)


def test_unwritable_folders_are_refused_as_the_os_reports_them(
    tmp_path: Path, heads: Path, monkeypatch, capsys
) -> None:
    """The same check, with the OS's answer for the folder made 'not writable' (so it runs as root too)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and access(path, mode))
    for argv in _cases_in(locked, heads):
        assert_refused(argv, capsys, f"{locked} is not writable")


def test_bench_heads_given_names(heads: Path, capsys, sandbox) -> None:
    argv = ["bench", "--draft", "none", "--medusa", f"eagle3={heads}", "--medusa", str(heads)]
    assert run_cli([*argv, "--methods", "plain,eagle3-8,eagle3-dyn4-lookup,medusa-5"], capsys)[0] == 0
    (args,) = sandbox["bench"].calls[-1]
    assert [(m.name, m.heads) for m in args.resolved_methods] == [
        ("plain", None),
        ("eagle3-8", "eagle3"),
        ("eagle3-dyn4-lookup", "eagle3"),
        ("medusa-5", None),
    ]
    assert_refused([*argv, "--methods", "plain,eagle-8"], capsys, "Unknown method 'eagle-8'", "heads named: eagle3")
    for name, fragment in (("specdec", "first word of other methods"), ("Big", "lower-case"), ("a-b", "lower-case")):
        assert_refused(["bench", "--medusa", f"{name}={heads}"], capsys, "--medusa", fragment)
    two = ["bench", "--medusa", str(heads), "--medusa", str(heads)]
    assert_refused(two, capsys, "2 heads without a name")
    assert_refused(["bench", "--medusa", f"a={heads}", "--medusa", f"a={heads}"], capsys, "names two heads alike")
    assert_refused(["bench", "--medusa", f"a={heads}/missing"], capsys, "--medusa", "does not exist")
    assert_refused([*argv, "--methods", "plain,specdec,specdec"], capsys, "specdec listed twice")
    odd = heads.parent / "run=2"  # a folder whose name holds "=" is a folder, not NAME=PATH
    heads.rename(odd)
    assert run_cli(["bench", "--draft", "none", "--medusa", str(odd), "--methods", "plain,medusa-4"], capsys)[0] == 0


def test_bench_heads_with_adapters_run_alone(medusa2_heads: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other"
    MedusaConfig(num_heads=2, base_model_name_or_path=str(tmp_path / "base")).save_pretrained(other)
    argv = ["bench", "--medusa", f"a={medusa2_heads}", "--medusa", f"b={other}"]
    assert_refused(argv, capsys, "merge them into the target", "benchmark them alone")


# Optional dependencies: refused at once, with the extra --------------------------------------------------------


def test_bench_without_matplotlib_stops_before_the_benchmark(monkeypatch, capsys, sandbox) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert_refused(["bench", "--out", "results"], capsys, "needs matplotlib", 'pip install -e ".[bench]"')
    assert not sandbox["bench"].calls and not Path("results").exists()


def test_simulate_plot_without_matplotlib(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["simulate", "--cost-ratio", "0.2", "--plot", "speedup.png"]
    assert_refused(argv, capsys, "--plot needs matplotlib", 'pip install -e ".[plot]"')
    assert not Path("speedup.png").exists()
    assert run_cli(["simulate", "--cost-ratio", "0.2", "--json"], capsys)[0] == 0  # no plot: no matplotlib needed


def test_zoo_models_to_convert_need_gguf(tmp_path: Path, monkeypatch, capsys, sandbox) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    for argv in (["demo"], ["bench", "--draft", "none"]):
        assert_refused(argv, capsys, "converting zoo model qwen2.5-coder-1.5b", 'pip install -e ".[models]"')
    assert_refused(
        ["export", "org/heads", "--to", "vllm", "--out", "o", "--base", "smollm2-135m"], capsys, '".[models]"'
    )
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):  # converted already: gguf is not needed
        (tmp_path / "cache" / "models" / name).mkdir(parents=True)
    assert run_cli(["demo"], capsys)[0] == 0
    assert len(sandbox["demo"].calls) == 1


def test_heads_with_base_adapters_need_peft(medusa2_heads: Path, monkeypatch, capsys, sandbox) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    assert_refused(["bench", "--medusa", str(medusa2_heads)], capsys, "needs peft", 'pip install -e ".[train]"')
    argv = ["export", str(medusa2_heads), "--to", "vllm", "--out", "o", "--merge-base-into", "merged"]
    assert_refused(argv, capsys, "needs peft", '".[train]"')
    assert not sandbox["bench"].calls and not Path("o").exists() and not Path("merged").exists()


def test_export_of_heads_with_base_adapters_asks_for_the_merged_base(medusa2_heads: Path, a_file: Path, capsys) -> None:
    argv = ["export", str(medusa2_heads), "--to", "tgi", "--out", "o"]
    assert_refused(argv, capsys, "LoRA adapters on their base", "--merge-base-into DIR")
    assert_refused([*argv, "--merge-base-into", "o"], capsys, "give the base its own folder")
    assert_refused([*argv, "--merge-base-into", str(a_file)], capsys, "--merge-base-into", "is a file")
    assert not Path("o").exists()


# The backstop: what a user can cause is one line; bugs keep their traceback -----------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad\nvalue"),
        TypeError("bad type"),
        FileNotFoundError(2, "No such file or directory", "x"),
        PermissionError(13, "Permission denied", "x"),
        IsADirectoryError(21, "Is a directory", "x"),
        NotADirectoryError(20, "Not a directory", "x"),
        FileExistsError(17, "File exists", "x"),
    ],
)
def test_user_errors_during_the_work_are_one_line(error: Exception, monkeypatch, capsys) -> None:
    def fail(args) -> int:
        raise error

    monkeypatch.setattr(bench_cli, "run_bench", fail)
    assert_refused(["bench", "--draft", "none"], capsys, "hf-specdec bench: error: ")


@pytest.mark.parametrize("error", [RuntimeError("a bug"), KeyError("a bug"), AssertionError("a bug")])
def test_bugs_keep_their_traceback(error: Exception, monkeypatch) -> None:
    def fail(args) -> int:
        raise error

    monkeypatch.setattr(bench_cli, "run_bench", fail)
    with pytest.raises(type(error)):
        main(["bench", "--draft", "none"])


# Good input still runs, and --help shows defaults and zoo names --------------------------------------------------


def test_good_input_reaches_the_work(tmp_path: Path, capsys, sandbox) -> None:
    assert run_cli(["bench", "--draft", "none", "--methods", "plain,lookup", "--n", "3"], capsys)[0] == 0
    (args,) = sandbox["bench"].calls[0]
    assert (
        [m.name for m in args.resolved_methods] == ["plain", "lookup"]
        and args.draft is None
        and args.out == Path("bench_results")
    )
    sandbox["data"].value = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt"}]}]
    assert run_cli(["data", "--n", "1", "--out", "deep/er/a.jsonl"], capsys)[0] == 0
    assert json.loads(Path("deep/er/a.jsonl").read_text())["id"] == "a"


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("demo", ["(default: 64)", "(default: auto)", *ZOO]),
        ("bench", ["(default: 12)", "(default: bench_results)", "(default: plain,hf-assistant", *ZOO]),
        ("data", ["(default: 1000)", "(default: 0.0)"]),
        ("simulate", ["(default: 0..8)", "(default: 0.8)", "(default: 2.0)"]),
        ("export", ["(default: bfloat16)", "--merge-base-into DIR", *ZOO]),
    ],
)
def test_help_shows_defaults_and_zoo_names(command: str, shown: list[str], capsys) -> None:
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    for text in shown:
        assert text in out


def test_a_hub_id_that_cannot_be_loaded_is_refused_with_what_to_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreachable or misspelt Hub id ends with what was tried and what to pass (a `ValueError`, one line from
    the commands), not a traceback."""
    from transformers import AutoModelForCausalLM

    from hf_specdec.zoo import load_model

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(ValueError, match="'someone/no-such-model' is neither a zoo model") as error:
        load_model("someone/no-such-model")
    assert "couldn't connect" in str(error.value) and "Hub id this machine can download" in str(error.value)
