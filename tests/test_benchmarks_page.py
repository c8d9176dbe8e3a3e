"""docs/benchmarks.md shows its runs as they were: every results block renders again, byte for byte, from the run's
results kept in docs/results/; the page stays short; every image it shows exists and no stale image lingers."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from hf_specdec.bench import page, sweep

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "benchmarks.md"
README = DOCS.parent / "README.md"


def _results(name: str) -> dict:
    return json.loads((DOCS / "results" / f"{name}.json").read_text())


SWEEPS = {"bf16-sweep": [1, 4, 8, 16], "fp32-sweep": [1, 4, 8]}  # a run per batch size (`bench.sweep`)


def test_every_results_block_is_what_its_run_renders() -> None:
    on_page = {"batch1", "batch4", "fp32-b1-packed:table"}
    for path, expected in ((PAGE, on_page | set(SWEEPS)), (README, {"batch1:table"})):
        blocks = page.blocks(path.read_text())
        assert set(blocks) == expected, path
        for name, block in blocks.items():
            if name in SWEEPS:
                runs = json.loads((DOCS / "results" / f"{name}.json").read_text())
                assert block == sweep.render(name, runs), name
                assert [run["settings"]["batch_size"] for run in runs] == SWEEPS[name]
                assert (DOCS / "img" / f"{name}.png").is_file()
                continue
            run = name.partition(":")[0]
            plots = all((DOCS / "img" / f"{run}-{plot}").exists() for plot in page.PLOTS)
            assert block == page.render(name, _results(run), plots), (path, name)


def test_the_page_is_short_and_shows_only_images_that_exist() -> None:
    text = PAGE.read_text()
    assert len(text.splitlines()) <= 280
    shown = set(re.findall(r"\]\((img/[^)]+)\)", text))
    assert shown and all((DOCS / image).is_file() for image in shown)
    pages = [p.read_text() for p in DOCS.glob("*.md")] + [(DOCS.parent / "README.md").read_text()]
    unused = [p.name for p in (DOCS / "img").iterdir() if not any(p.name in text for text in pages)]
    assert unused == []


def test_a_run_rewrites_its_block_and_keeps_its_results_and_plots(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    results = _results("batch1") | {"samples": [{"row": 0}]}
    results["summary"]["plain"]["tokens_per_second"] = 123.456
    (run / "results.json").write_text(json.dumps(results))
    for plot in page.PLOTS:
        (run / plot).write_bytes(b"png")
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copyfile(PAGE, docs / "benchmarks.md")
    shutil.copyfile(README, tmp_path / "README.md")
    page.main([str(docs / "benchmarks.md"), str(tmp_path / "README.md"), f"batch1={run}"])
    assert "| 123.46 |" in page.blocks((tmp_path / "README.md").read_text())["batch1:table"]
    blocks = page.blocks((docs / "benchmarks.md").read_text())
    assert "| 123.46 |" in blocks["batch1"]
    assert blocks["batch4"] == page.blocks(PAGE.read_text())["batch4"]  # the other block is left as it was
    kept = json.loads((docs / "results" / "batch1.json").read_text())
    assert "samples" not in kept and kept["summary"]["plain"]["tokens_per_second"] == 123.456
    assert all((docs / "img" / f"batch1-{plot}").read_bytes() == b"png" for plot in page.PLOTS)


def test_a_page_without_the_block_or_a_folder_without_results_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no block 'batch9'"):
        page.embed("# A page\n", "batch9", "table")
    (tmp_path / "page.md").write_text("# A page\n")
    with pytest.raises(SystemExit):  # no results.json there
        page.main([str(tmp_path / "page.md"), f"batch1={tmp_path}"])
    (tmp_path / "results.json").write_text(json.dumps(_results("batch1")))
    with pytest.raises(SystemExit):  # no page has the block
        page.main([str(tmp_path / "page.md"), f"batch1={tmp_path}"])


def test_a_sweep_rewrites_its_block_from_one_run_per_batch_size(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text("Before.\n\n<!-- results:sweep -->\n<!-- /results:sweep -->\n\nAfter.\n")
    folders = []
    for batch, speedup in ((8, 0.97), (1, 1.6)):  # any order: the block goes by batch size
        results = _results("batch1") | {"samples": []}
        results["settings"] = results["settings"] | {"batch_size": batch}
        results["summary"]["specdec"]["speedup_vs_plain"] = speedup
        folder = tmp_path / f"b{batch}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(results))
        folders.append(folder)
    sweep.main([str(docs / "page.md"), "sweep", *map(str, folders)])
    block = page.blocks((docs / "page.md").read_text())["sweep"]
    header, _, plain, *rows = block.split("\n\n")[0].splitlines()
    assert header.endswith("| batch 1 | batch 8 |") and plain.startswith("| `plain` |")
    specdec = next(row for row in rows if row.startswith("| `specdec` |"))
    assert "| 1.60x (tau" in specdec and "| 0.97x (tau" in specdec
    assert block.count("Measured on ") == 2 and (docs / "img" / "sweep.png").stat().st_size > 0
    kept = json.loads((docs / "results" / "sweep.json").read_text())
    assert [run["settings"]["batch_size"] for run in kept] == [1, 8] and "samples" not in kept[0]
    with pytest.raises(SystemExit):
        sweep.main([str(docs / "page.md"), "other", *map(str, folders)])
