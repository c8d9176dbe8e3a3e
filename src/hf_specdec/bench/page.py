"""Documentation pages' results, regenerated from benchmark runs, so that the pages cannot drift from them.

A page marks each block it embeds with `<!-- results:NAME -->` ... `<!-- /results:NAME -->` (the whole run: its
results table with the "Measured on" line, a table by prompt category and draft position, and the run's plots) or
`<!-- results:NAME:table -->` ... `<!-- /results:NAME:table -->` (the results table and its "Measured on" line
alone). For every `NAME=RUN_FOLDER` given, each page's blocks of that name are rewritten from the run's
`results.json`. The run's settings and summary are kept beside the first page (`results/NAME.json`, without the
per-prompt samples) and its plots under `img/`, so a test can render the blocks again and compare::

    python -m hf_specdec.bench.page docs/benchmarks.md README.md batch1=bench_results/qwen_b1 \\
        batch4=bench_results/qwen_b4
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

from hf_specdec.bench.markdown import format_markdown

PLOTS = ("speedup_by_category.png", "tau_and_acceptance.png")
_POSITIONS = 4  # draft positions shown in the detail table


def _marks(name: str) -> tuple[str, str]:
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def render(name: str, results: dict[str, Any], plots: bool) -> str:
    """The block `name` for its run's results: `RUN:table` is the results table and its "Measured on" line;
    `RUN` adds the detail table and, when `plots`, the run's plots (`img/RUN-*.png`)."""
    run, _, kind = name.partition(":")
    summary, settings = results["summary"], results["settings"]
    table = format_markdown(summary, settings).rstrip("\n")
    if kind == "table":
        return table
    if kind:
        raise ValueError(f"Block {name!r}: a block is RUN or RUN:table.")
    parts = [table, _details(summary)]
    if plots:
        parts.append(" ".join(f"![{plot.removesuffix('.png')}](img/{run}-{plot})" for plot in PLOTS))
    return "\n\n".join(part for part in parts if part)


def _details(summary: dict[str, dict[str, Any]]) -> str:
    """Speedup over plain by prompt category, acceptance by draft position (of the steps that drafted a j-th token,
    the share that accepted it and every draft before it) and the share of time spent drafting, per method."""
    methods = [name for name in summary if name != "plain"]
    # The categories in the run's order; "mixed" (batches of prompts from several categories) is the overall figure.
    categories = list(dict.fromkeys(c for name in methods for c in summary[name].get("speedup_by_category", {})))
    categories = [c for c in categories if c != "mixed"]
    if not methods:
        return ""
    header = [
        "method",
        *(f"vs plain, {c}" for c in categories),
        *(f"accepted, j={j}" for j in range(1, _POSITIONS + 1)),
        "time drafting",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in methods:
        entry = summary[name]
        by_category = entry.get("speedup_by_category", {})
        cells = [f"`{name}`", *(_value(by_category.get(c), "{:.2f}x") for c in categories)]
        accepted = entry.get("acceptance_by_position") or []
        cells += [_value(accepted[j] if j < len(accepted) else None, "{:.2f}") for j in range(_POSITIONS)]
        cells.append(_value(entry.get("draft_share_of_time"), "{:.0%}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _value(value: float | None, form: str) -> str:
    return "" if value is None else form.format(value)


def blocks(page: str) -> dict[str, str]:
    """The results blocks a page embeds, by name, as the page has them (without the marks)."""
    found = {}
    for match in re.finditer(r"<!-- results:([\w:-]+) -->\n(.*?)\n?<!-- /results:\1 -->", page, flags=re.DOTALL):
        found[match.group(1)] = match.group(2)
    return found


def embed(page: str, name: str, block: str) -> str:
    """`page` with the block `name` replaced by `block`; a page without that block's marks is an error."""
    start, end = _marks(name)
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), flags=re.DOTALL)
    if not pattern.search(page):
        raise ValueError(f"The page has no block {name!r}: add the lines {start} and {end} where it goes.")
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", page, count=1)


def kept_results(results: dict[str, Any]) -> dict[str, Any]:
    """What the page keeps of a run: its settings and summary (the per-prompt samples stay in the run folder)."""
    return {"settings": results["settings"], "summary": results["summary"]}


def update(pages: list[Path], runs: dict[str, Path]) -> None:
    """Rewrite the blocks of `pages` named after each run from the run's folder, keeping the run's results in
    `results/RUN.json` and, where a block shows them, its plots in `img/RUN-*.png` beside the first page."""
    root = pages[0].parent
    texts = {path: path.read_text() for path in pages}
    for run, folder in runs.items():
        results = kept_results(json.loads((folder / "results.json").read_text()))
        plots = all((folder / plot).exists() for plot in PLOTS)
        names = {name for text in texts.values() for name in blocks(text) if name.partition(":")[0] == run}
        if not names:
            start, end = _marks(run)
            raise ValueError(f"No page has a block {run!r}: add the lines {start} and {end} where it goes.")
        for path, text in texts.items():
            for name in blocks(text):
                if name in names:
                    text = embed(text, name, render(name, results, plots))
            texts[path] = text
        (root / "results").mkdir(exist_ok=True)
        (root / "results" / f"{run}.json").write_text(json.dumps(results, indent=1) + "\n")
        if plots and any(":" not in name for name in names):  # a block that shows the plots (not a table alone)
            (root / "img").mkdir(exist_ok=True)
            for plot in PLOTS:
                shutil.copyfile(folder / plot, root / "img" / f"{run}-{plot}")
    for path, text in texts.items():
        path.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hf_specdec.bench.page",
        description="Rewrite pages' results blocks from benchmark run folders (each holding results.json).",
    )
    parser.add_argument(
        "items",
        nargs="+",
        metavar="PAGE | NAME=RUN_FOLDER",
        help="the markdown pages (the run's results are kept beside the first), then each run's name and folder",
    )
    args = parser.parse_args(argv)
    pages = [Path(item) for item in args.items if "=" not in item]
    runs = {}
    for item in args.items:
        name, sep, folder = item.partition("=")
        if not sep:
            continue
        if not name or not (Path(folder) / "results.json").is_file():
            parser.error(f"{item!r}: give NAME=RUN_FOLDER, a folder where `hf-specdec bench --out` wrote results.json")
        runs[name] = Path(folder)
    if not pages or not runs:
        parser.error("give at least one page and one NAME=RUN_FOLDER")
    try:
        update(pages, runs)
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
