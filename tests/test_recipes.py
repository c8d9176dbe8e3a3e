"""Every recipe script's commands take the arguments they give: the training recipe's (options and their checks),
`hf-specdec`'s, and the scaling tool's, parsed by the real parsers (the runs themselves take minutes to hours)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_specdec.cli import build_parser
from hf_specdec.training import MedusaTrainingConfig

RECIPES = sorted((Path(__file__).resolve().parent.parent / "recipes").glob("*.sh"))
VALUES = {"out": "heads/x", "data": "heads/x/data", "1": "heads/x", "DRY_RUN": "--dry_run"}


def commands(script: Path) -> list[list[str]]:
    """The script's commands, continuation lines joined, shell variables given values, `$(dirname "$0")` the
    recipes folder; `pick` arrays expanded."""
    text = re.sub(r"\\\n\s*", " ", script.read_text())
    arrays = dict(re.findall(r"^(\w+)=\((.*)\)$", text, re.M))
    result = []
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith("[ -s") and "||" in line:  # `[ -s FILE ] || command`: the command
            line = line.split("||", 1)[1].strip()
        skipped = ("#", "set ", "mkdir", "if ", "else", "fi", "echo", "head ", "tail ", "[ -z")
        if not line or line.startswith(skipped) or "=" in line.split()[0]:
            continue
        line = line.replace('$(dirname "$0")', "recipes")
        for name, value in arrays.items():
            line = line.replace(f'"${{{name}[@]}}"', value)
        # `${DRY_RUN:+--dry_run}` as when DRY_RUN is set: the dry run's flag parses too.
        line = re.sub(r"\$\{(\w+)(?::[-+][^}]*)?\}|\$(\w+)", lambda m: VALUES[m.group(1) or m.group(2)], line)
        result.append(shlex.split(line))
    return result


def _scaling_tool_parser():
    spec = importlib.util.spec_from_file_location("scaling_curve", RECIPES[0].parent.parent / "tools/scaling_curve.py")
    assert spec is not None and spec.loader is not None
    return spec


@pytest.mark.parametrize("script", RECIPES, ids=lambda path: path.name)
def test_recipe_commands_parse(script: Path, monkeypatch) -> None:
    ran = []
    for argv in commands(script):
        if argv[0] == "hf-specdec":
            args = build_parser().parse_args(argv[1:])
            args.check(args)
        elif argv[:2] == ["python", "recipes/train_medusa.py"]:
            HfArgumentParser((MedusaTrainingConfig, TrainingArguments)).parse_args_into_dataclasses(args=argv[2:])
        elif argv[:2] == ["python", "recipes/../tools/scaling_curve.py"]:
            spec = _scaling_tool_parser()
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            monkeypatch.setattr(module, "load_model", lambda *a, **k: (_ for _ in ()).throw(SystemExit("parsed")))
            with pytest.raises(SystemExit, match="parsed"):
                module.main(argv[2:])
        else:
            raise AssertionError(f"{script.name}: no rule for {argv}")
        ran.append(argv[0] if argv[0] != "python" else argv[1])
    assert "recipes/train_medusa.py" in ran


DOCS = RECIPES[0].parent.parent / "docs"


@pytest.mark.parametrize("name", re.findall(r"<!-- scaling-table (\S+) -->", (DOCS / "training.md").read_text()))
def test_each_scaling_table_in_the_docs_is_what_its_points_render(tmp_path: Path, name: str) -> None:
    spec = _scaling_tool_parser()
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    points_file = DOCS / "results" / f"scaling-{name}.json"
    points = json.loads(points_file.read_text())
    page = (DOCS / "training.md").read_text()
    opening, closing = module.markers(name)
    shown = page.split(opening)[1].split(closing)[0].strip()
    assert shown == module.table(points)
    assert len(shown.splitlines()) == len(points) + 2 >= 5  # at least three points, as the curves promise
    assert (DOCS / "img" / f"scaling-{name}.png").exists()
    copy = tmp_path / "training.md"
    copy.write_text(page.replace(shown, "| stale |"))
    module.main(["--base", "b", "--run", "r", "--steps", str(points[0]["step"]), "--eval-data", "e", "--out",
                 str(points_file), "--docs", str(copy), "--table", name])  # fmt: skip
    assert copy.read_text() == page  # every point measured already: nothing loads, the table renders again


def test_a_self_distilled_run_counts_the_tokens_of_the_replies_it_kept(tmp_path: Path) -> None:
    import datasets

    spec = _scaling_tool_parser()
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    run = tmp_path / "run"
    assert module.mean_example_tokens(run, None, None, 512) == 0.0
    for source, lengths in {"a": [3, 5], "b": [10]}.items():
        rows = [{"input_ids": list(range(n))} for n in lengths]
        datasets.Dataset.from_list(rows).save_to_disk(str(run / "self_distill_states" / source / "shard-0000000"))
    assert module.mean_example_tokens(run, None, None, 512) == 6.0
    checkpoint = run / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "train_batch_size": 4}))
    assert module.trained_on(checkpoint, 6.0) == {"step": 2, "examples": 8, "tokens": 48}
