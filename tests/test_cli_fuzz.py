"""Fuzz the `hf-specdec` command line: argument lists drawn for each subcommand, mixing good flags with bad values,
missing and extra paths, files where folders go (and the reverse), unwritable folders and unknown flags. Whatever is
drawn, `main` either succeeds or exits with status 2 and exactly one line on stderr; never a traceback.

The heavy work (a demo, a benchmark, an export, the ShareGPT download) is replaced by recorders, which also check
that what reaches them was validated; `simulate` and `data` run for real, on values that keep them fast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_specdec import MedusaConfig
from hf_specdec.bench import cli as bench_cli
from hf_specdec.bench import demo, gpu_cli, prompts
from hf_specdec.cli import main
from hf_specdec.serving import cli as serving_cli
from hf_specdec.zoo import ZOO

FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ROOT = os.geteuid() == 0  # root writes anywhere: read-only folders are left out

# Good values first, then bad ones (every option's values are split so: (good, bad)).
INTS = (["1", "3"], ["0", "-2", "ten", "1.5", "", "99999999999999999999"])
FLOATS = (["0", "0.5", "1"], ["-1", "nan", "inf", "abc", "97", ""])
DTYPES = (["bfloat16", "float32"], ["int4"])
MODEL_DTYPES = (["auto", "bfloat16", "float32"], ["int4", "Auto"])  # of the commands that run models
JUNK = ["--frobnicate", "extra", "-x", "--n", "--out"]
RECORDS = [
    {"id": f"c{i}", "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]}
    for i, text in enumerate(["Write python code to sort", "A poem about the sea", "Solve 2 + 2 = ?"])
]


@dataclass
class World:
    """The paths the fuzzer draws from, and what reached the heavy functions."""

    root: Path
    calls: list[str] = field(default_factory=list)

    def outputs(self) -> tuple[list[str], list[str]]:
        """Paths to write: new ones and an existing folder (good); an existing file, a path under a file, and
        read-only folders unless running as root (bad)."""
        r = self.root
        locked = [] if ROOT else [str(r / "locked"), str(r / "locked" / "x")]
        return ["new_out", "deep/er/o", str(r / "a_dir")], [str(r / "a_file.txt"), str(r / "a_file.txt" / "x"), *locked]

    def heads(self) -> tuple[list[str], list[str]]:
        """Folders of heads and a Hub id (good); heads an engine cannot serve, a folder without heads, a file, a
        missing path (bad)."""
        r = self.root
        bad = [str(r / "recurrent"), str(r / "a_dir"), str(r / "a_file.txt"), str(r / "missing" / "x"), ""]
        return [str(r / "heads"), str(r / "medusa2"), "org/heads"], bad

    def models(self) -> tuple[list[str], list[str]]:
        r = self.root
        return [*ZOO, "org/model", str(r / "a_dir")], ["qwen-9b", str(r / "a_file.txt"), str(r / "missing"), ""]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path / "cache"))
    world = World(tmp_path)
    (tmp_path / "a_file.txt").write_text("a file\n")
    (tmp_path / "a_dir").mkdir()
    MedusaConfig(num_heads=2, base_model_name_or_path="org/base").save_pretrained(tmp_path / "heads")
    MedusaConfig(num_heads=2, base_model_name_or_path="org/base").save_pretrained(tmp_path / "medusa2")
    (tmp_path / "medusa2" / "base_adapter").mkdir()
    MedusaConfig(head_type="recurrent", base_model_name_or_path="org/base").save_pretrained(tmp_path / "recurrent")
    if not ROOT:
        (tmp_path / "locked").mkdir(mode=0o500)
    _replace_heavy_work(world, monkeypatch)
    yield world
    if not ROOT:
        (tmp_path / "locked").chmod(0o700)


def _replace_heavy_work(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_demo(target: str, draft: str, prompt_list: list[str], max_new_tokens: int, *args, **kwargs) -> bool:
        assert max_new_tokens >= 1 and all(p.strip() for p in prompt_list)
        world.calls.append("demo")
        return True

    def run_bench(args) -> int:
        assert not Path(args.out).is_file() and args.n >= 1 and args.resolved_methods[0].name == "plain"
        world.calls.append("bench")
        return 0

    def run_export(args) -> int:
        assert not Path(args.out).is_file() and args.to in ("vllm", "tgi", "tensorrt-llm")
        if Path(args.heads).is_dir():  # a local folder: --merge-base-into exactly when there are adapters to merge
            assert (args.merge_base_into is not None) == Path(args.heads, "base_adapter").is_dir()
        world.calls.append("export")
        return 0

    def run_overhead(args) -> int:
        assert args.paths and args.new_tokens >= 1 and args.repeats >= 1
        world.calls.append("overhead")
        return 0

    monkeypatch.setattr(demo, "run_demo", run_demo)
    monkeypatch.setattr(bench_cli, "run_bench", run_bench)
    monkeypatch.setattr(bench_cli, "run_overhead", run_overhead)

    def run_gpu(args) -> int:
        assert args.budget_seconds > 0 and args.device == "cpu" and 1 in (args.compiled_widths or (1,))
        world.calls.append("gpu")
        return 0

    monkeypatch.setattr(gpu_cli, "run_gpu", run_gpu)
    monkeypatch.setattr(serving_cli, "run_export", run_export)
    monkeypatch.setattr(prompts, "sharegpt_v3_conversations", lambda: list(RECORDS))


def _specs(world: World) -> dict[str, dict]:
    """Per subcommand: its options, each with (good values, bad values), or None for a switch."""
    outputs, models, heads = world.outputs(), world.models(), world.heads()
    return {
        "demo": {
            "--target": models,
            "--draft": models,
            "--prompt": (["hello"], ["", " "]),
            "--max-new-tokens": INTS,
            "--num-assistant-tokens": INTS,
            "--dtype": MODEL_DTYPES,
            "--pack-linears": None,
            "--no-pack-linears": None,
        },
        "bench": {
            "--target": models,
            "--draft": ([*models[0], "none"], models[1]),
            "--medusa": heads,
            "--draft-vocab-size": INTS,
            "--prompts": (["mt-bench,gsm8k", "humaneval"], ["mt-bench,poems", "", ","]),
            "--n": INTS,
            "--batch-size": INTS,
            "--max-new-tokens": INTS,
            "--methods": (["plain", "plain,specdec", "plain,medusa-8"], ["specdec", "plain,plain", "plain,nope", ""]),
            "--do-sample": None,
            "--dtype": DTYPES,
            "--device": (["cpu"], ["cuda:7", "toaster", "meta"]),
            "--cost-curve": None,
            "--compile": None,
            "--seed": INTS,
            "--out": outputs,
        },
        "overhead": {
            "--paths": (["plain", "plain,lookup", "eagle,tree-8"], ["", ",", "plain,nope", "Plain"]),
            "--new-tokens": INTS,
            "--batch-size": INTS,
            "--repeats": INTS,
            "--seed": INTS,
        },
        "gpu": {
            "--device": (["cpu"], ["cuda:7", "toaster", "meta", "mps"]),
            "--dtype": DTYPES,
            "--pairs": (
                ["qwen2.5-1.5b:qwen2.5-0.5b", "llama-3.1-8b:llama-3.2-1b,qwen2.5-1.5b:qwen2.5-0.5b"],
                ["qwen2.5-1.5b", "a:b", "", "qwen2.5-1.5b:qwen2.5-0.5b:x"],
            ),
            "--compiled-widths": (["1,4,8", "none", "1"], ["4,8", "5", "0,1", "abc", ""]),
            "--budget-seconds": FLOATS,
            "--tiny": None,
            "--json": (["out.json", "deep/out.json"], [str(world.root / "a_dir"), *outputs[1]]),
            "--tests": None,
        },
        "data": {
            "--n": INTS,
            "--max-prompt-chars": (["100", "1000"], INTS[1]),
            "--min-prompt-chars": (["0", "5"], INTS[1]),
            "--skip": (["0", "1"], INTS[1]),
            "--topic": (["code", "maths", "other"], ["poetry"]),
            "--min-ascii": FLOATS,
            "--out": (["new.jsonl", "deep/new.jsonl"], [*outputs[1], str(world.root / "a_dir")]),
        },
        "simulate": {
            "--alpha": (["0.8", "0.9,0.8"], ["80", "nan", "-0.1", "abc"]),
            "--gamma": (["4", "1,2,4", "1..8"], ["8..1", "-1", "abc", "1..2000", "1..2..3"]),
            "--cost-ratio": FLOATS,
            "--cost-curve": (["cpu-qwen-1.5b", "1:139,8:140"], ["1:2:3", "abc", ""]),
            "--device": (["cpu", "h100"], ["tpu"]),
            "--target-params": (["7e9"], ["-1", "abc", "0", "nan"]),
            "--draft-params": (["1e9"], ["-1", "abc", "0"]),
            "--bytes-per-param": (["1", "2"], FLOATS[1]),
            "--overhead-ms": FLOATS,
            "--batch-size": (["1", "4"], ["0", "-1", "x"]),
            "--tree-probs": (["[[0.6,0.15],[0.5]]"], ["[[1.5]]", "{", "5", "[]", "[[]]", '[["a"]]', "[[true]]"]),
            "--tree-sizes": (["1..3", "2"], ["0", "8..1", "1..2000"]),
            "--monte-carlo": (["2", "20"], ["0", "-1", "abc"]),
            "--seed": INTS,
            "--json": None,
            "--plot": (["speedup.png", "deep/p.svg"], ["p.txt", str(world.root / "a_dir"), *outputs[1]]),
            "--plot-alphas": (["0.5,0.9"], ["abc", "nan"]),
        },
        "export": {
            "heads": heads,
            "--to": (["vllm", "tgi", "tensorrt-llm"], ["sglang"]),
            "--out": outputs,
            "--base": models,
            "--base-name": (["org/base", "name"], [""]),
            "--dtype": DTYPES,
            "--merge-base-into": outputs,
        },
    }


REQUIRED = {"data": ["--out"], "export": ["heads", "--to", "--out"]}


@st.composite
def _argv(draw: st.DrawFn, command: str, world: World) -> list[str]:
    """An argument list for `command`: all good values (a third of the draws), or good and bad ones mixed with an
    unknown flag or a stray word now and then; the required arguments are left out now and then."""
    options = _specs(world)[command]
    all_good = draw(st.integers(0, 2)) == 0
    optional = sorted(flag for flag in options if flag not in REQUIRED.get(command, []))
    chosen = draw(st.lists(st.sampled_from(optional), unique=True, max_size=6))
    chosen += [flag for flag in REQUIRED.get(command, []) if all_good or draw(st.integers(0, 5))]
    pieces = [[command]]
    for flag in draw(st.permutations(chosen)):
        if options[flag] is None:
            pieces.append([flag])
            continue
        good, bad = options[flag]
        value = draw(st.sampled_from(good if all_good or draw(st.integers(0, 2)) else bad))
        if flag == "heads":
            pieces.insert(1, [value])
        else:
            pieces.append([f"{flag}={value}"] if draw(st.booleans()) else [flag, value])
    for junk in [] if all_good else draw(st.lists(st.sampled_from(JUNK), max_size=1)):
        pieces.insert(draw(st.integers(1, len(pieces))), [junk])
    return [token for piece in pieces for token in piece]


def _check_property(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    _, err = capsys.readouterr()
    if code != 0:
        lines = err.splitlines()
        assert code == 2, f"{argv}: exit status {code}\n{err}"
        assert len(lines) == 1 and lines[0].strip(), f"{argv}: stderr is not one line:\n{err}"
        assert lines[0].startswith("hf-specdec"), f"{argv}: {lines[0]}"


@pytest.mark.parametrize("command", ["demo", "bench", "overhead", "gpu", "data", "simulate", "export"])
def test_every_drawn_command_line_succeeds_or_fails_in_one_line(command: str, world: World, capsys) -> None:
    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _check_property(data.draw(_argv(command, world)), capsys)

    check()
    if command in ("demo", "bench", "export"):  # good input was drawn too: the work was reached
        assert command in world.calls
