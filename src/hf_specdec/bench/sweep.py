"""A batch sweep on a documentation page: one table of every method's speedup over plain `generate()` at each batch
size, and a plot of speedup against batch, from one benchmark run per batch size.

A page marks the sweep with `<!-- results:NAME -->` ... `<!-- /results:NAME -->`; the runs' settings and summaries
are kept beside the page (`results/NAME.json`, a list, smallest batch first) and the plot under `img/NAME.png`, so
that a test can render the block again and compare::

    python -m hf_specdec.bench.sweep docs/benchmarks.md sweep-bf16 bench_results/b1 bench_results/b4 \\
        bench_results/b8 bench_results/b16
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hf_specdec.bench.markdown import measured_on
from hf_specdec.bench.page import blocks, embed, kept_results


def render(name: str, runs: list[dict[str, Any]]) -> str:
    """The block: a row per method (in the order the runs first name them), a column per batch size with the
    speedup over plain and tau, plain's tokens per second, the plot, and each run's "Measured on" line."""
    batches = [run["settings"]["batch_size"] for run in runs]
    methods = list(dict.fromkeys(method for run in runs for method in run["summary"] if method != "plain"))
    arguments = {k: v for run in runs for k, v in run["settings"].get("arguments", {}).items()}
    header = ["method", "`generate()` arguments", *(f"batch {b}" for b in batches)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    plain = [f"{run['summary']['plain']['tokens_per_second']:.2f} tok/s" for run in runs]
    lines.append("| `plain` | plain `generate()` | " + " | ".join(plain) + " |")
    for method in methods:
        cells = [f"`{method}`", f"`{arguments[method]}`" if arguments.get(method) else ""]
        for run in runs:
            entry = run["summary"].get(method)
            cells.append("" if entry is None else _cell(entry))
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    measured = "\n".join(f"- {measured_on(run['settings'])}" for run in runs)
    return f"{table}\n\n![{name}](img/{name}.png)\n\n{measured}"


def _cell(entry: dict[str, Any]) -> str:
    speedup, tau = entry.get("speedup_vs_plain"), entry.get("tau")
    text = "" if speedup is None else f"{speedup:.2f}x"
    return text + (f" (tau {tau:.2f})" if tau else "")


def plot(name: str, runs: list[dict[str, Any]], path: Path) -> None:
    """Speedup over plain against batch size, a line per method, plain's level marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    batches = [run["settings"]["batch_size"] for run in runs]
    methods = list(dict.fromkeys(method for run in runs for method in run["summary"] if method != "plain"))
    figure, axes = pyplot.subplots(figsize=(6.4, 4.0))
    for method in methods:
        points = [
            (batch, run["summary"][method]["speedup_vs_plain"])
            for batch, run in zip(batches, runs, strict=True)
            if method in run["summary"]
        ]
        axes.plot([b for b, _ in points], [s for _, s in points], marker="o", label=method)
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.set_xscale("log", base=2)
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.set_xlabel("batch size")
    axes.set_ylabel("speedup over plain generate()")
    settings = runs[0]["settings"]
    axes.set_title(f"{settings.get('target')}, {settings.get('dtype')}, {settings.get('machine')}", fontsize=8)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def update(page: Path, name: str, folders: list[Path]) -> None:
    """Rewrite `page`'s block `name` from the runs in `folders`, keeping their results and the plot beside it."""
    runs = sorted(
        (kept_results(json.loads((folder / "results.json").read_text())) for folder in folders),
        key=lambda run: run["settings"]["batch_size"],
    )
    text = page.read_text()
    if name not in blocks(text):
        raise ValueError(f"{page} has no block {name!r}: add the lines <!-- results:{name} --> and its end mark.")
    root = page.parent
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / f"{name}.json").write_text(json.dumps(runs, indent=1) + "\n")
    (root / "img").mkdir(exist_ok=True)
    plot(name, runs, root / "img" / f"{name}.png")
    page.write_text(embed(text, name, render(name, runs)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hf_specdec.bench.sweep",
        description="Rewrite a page's batch sweep block from one benchmark run folder per batch size.",
    )
    parser.add_argument("page", type=Path, help="the markdown page holding <!-- results:NAME --> ... its end mark")
    parser.add_argument("name", help="the block's name")
    parser.add_argument("folders", nargs="+", type=Path, help="run folders, each holding results.json")
    args = parser.parse_args(argv)
    missing = [str(folder) for folder in args.folders if not (folder / "results.json").is_file()]
    if missing:
        parser.error(f"no results.json in {', '.join(missing)}: give folders `hf-specdec bench --out` wrote")
    try:
        update(args.page, args.name, args.folders)
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
