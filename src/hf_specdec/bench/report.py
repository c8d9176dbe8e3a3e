"""A benchmark run's results (`Sample`, `BenchmarkResult`), aggregated per method: a table, JSON and PNG plots."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hf_specdec.extras import require


@dataclass
class Sample:
    """One method on one batch of prompts."""

    method: str
    batch: int
    categories: list[str]
    seconds: float
    new_tokens: list[int]
    target_forwards: list[int]
    accepted_tokens: list[int] = field(default_factory=list)
    drafted_at_position: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    matches_plain: list[bool] | None = None
    divergences: list[dict[str, Any]] = field(default_factory=list)
    peak_memory_bytes: int | None = None


@dataclass
class BenchmarkResult:
    """Everything a benchmark run measured; `summary()` aggregates it per method."""

    settings: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    cost_curve: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "summary": self.summary(),
            "skipped": self.skipped,
            "cost_curve_seconds": self.cost_curve,
            "samples": [asdict(s) for s in self.samples],
        }

    def summary(self) -> dict[str, dict[str, Any]]:
        return summarize(self)


def _rate(samples: list[Sample]) -> float:
    tokens = sum(sum(s.new_tokens) for s in samples)
    seconds = sum(s.seconds for s in samples)
    return tokens / seconds if seconds else 0.0


def _by_category(samples: list[Sample]) -> dict[str, list[Sample]]:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.categories[0] if len(set(s.categories)) == 1 else "mixed"].append(s)
    return groups


def summarize(result: BenchmarkResult) -> dict[str, dict[str, Any]]:
    """Per method: tokens/s, speedups, tau, acceptance by position, time split, identity, memory.

    `acceptance_by_position[j]` is the share of steps in which the (j+1)-th drafted token was accepted (so
    were all before it); its ratio to the previous entry is the acceptance rate conditional on reaching j.
    """
    by_method: dict[str, list[Sample]] = defaultdict(list)
    for sample in result.samples:
        by_method[sample.method].append(sample)
    if not by_method:
        return {}
    plain_name = result.samples[0].method if result.samples else "plain"
    plain_rate = _rate(by_method[plain_name])
    plain_by_category = {c: _rate(s) for c, s in _by_category(by_method[plain_name]).items()}
    hf_rate = _rate(by_method["hf-assistant"]) if "hf-assistant" in by_method else None
    summary: dict[str, dict[str, Any]] = {}
    for name, samples in by_method.items():
        rate = _rate(samples)
        entry: dict[str, Any] = {
            "tokens": sum(sum(s.new_tokens) for s in samples),
            "seconds": sum(s.seconds for s in samples),
            "tokens_per_second": rate,
            "speedup_vs_plain": rate / plain_rate if plain_rate else None,
            "speedup_vs_hf_assistant": rate / hf_rate if hf_rate else None,
            "speedup_by_category": {
                c: _rate(s) / plain_by_category[c] for c, s in _by_category(samples).items() if plain_by_category.get(c)
            },
        }
        forwards = sum(sum(s.target_forwards) for s in samples)
        if forwards:
            entry["tau"] = entry["tokens"] / forwards
            entry["target_forwards_per_token"] = forwards / entry["tokens"]
        drafted = _sum_lists([s.drafted_at_position for s in samples])
        if drafted:
            accepted = _sum_lists([s.accepted_at_position for s in samples])
            entry["acceptance_by_position"] = [a / d if d else None for a, d in zip(accepted, drafted, strict=False)]
            spent = sum(s.draft_seconds + s.verify_seconds for s in samples)
            entry["draft_share_of_time"] = sum(s.draft_seconds for s in samples) / spent if spent else None
        checked = [m for s in samples if s.matches_plain is not None for m in s.matches_plain]
        if checked:
            divergences = [d for s in samples for d in s.divergences]
            entry["identical_to_plain"] = f"{sum(checked)}/{len(checked)}"
            entry["divergences"] = divergences
            entry["divergences_beyond_tie"] = sum(1 for d in divergences if d.get("gap") is None or not d.get("tie"))
        peaks = [s.peak_memory_bytes for s in samples if s.peak_memory_bytes is not None]
        if peaks:
            entry["peak_memory_gib"] = max(peaks) / 2**30
        summary[name] = entry
    return summary


def _sum_lists(lists: list[list[int]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    """A plain-text table, one line per method."""
    header = f"{'method':<16} {'tok/s':>7} {'vs plain':>9} {'vs hf':>7} {'tau':>6} {'draft%':>7} {'identical':>10}"
    lines = [header, "-" * len(header)]
    for name, e in summary.items():
        lines.append(
            f"{name:<16} {e['tokens_per_second']:>7.2f} {_fmt(e.get('speedup_vs_plain'), 'x'):>9} "
            f"{_fmt(e.get('speedup_vs_hf_assistant'), 'x'):>7} {_fmt(e.get('tau')):>6} "
            f"{_fmt(e.get('draft_share_of_time'), '%'):>7} {e.get('identical_to_plain', '-'):>10}"
        )
    return "\n".join(lines)


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{100 * value:.0f}%"
    return f"{value:.2f}{unit}"


def write_outputs(result: BenchmarkResult, out_dir: Path) -> list[Path]:
    """Write `results.json`, `results.md` (the table a page embeds, `hf_specdec.bench.markdown`) and the PNG plots
    into `out_dir`; returns the files written."""
    from hf_specdec.bench.markdown import format_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    written = [out_dir / "results.json", out_dir / "results.md"]
    written[0].write_text(json.dumps(data, indent=2))
    written[1].write_text(format_markdown(data["summary"], result.settings))
    written += _plots(result, data["summary"], out_dir)
    return written


def _plots(result: BenchmarkResult, summary: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    require("bench", "matplotlib", purpose="Plotting the benchmark's results")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    # Speedup by category.
    fig, ax = plt.subplots(figsize=(7, 4))
    methods = [m for m in summary if m != "plain"]
    categories = sorted({c for m in methods for c in summary[m]["speedup_by_category"]})
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        values = [summary[m]["speedup_by_category"].get(c, 0.0) for c in categories]
        ax.bar([j + i * width for j in range(len(categories))], values, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(categories))], categories)
    ax.set_ylabel("speedup over plain generate()")
    ax.legend(fontsize=8)
    files.append(_save(fig, out_dir / "speedup_by_category.png"))
    # Tau distribution (per row) and acceptance by position, for this library's methods.
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for m in methods:
        rows = [
            (n, f)
            for s in result.samples
            if s.method == m and s.target_forwards
            for n, f in zip(s.new_tokens, s.target_forwards, strict=True)
        ]
        if rows:
            left.hist([n / f for n, f in rows], bins=20, alpha=0.6, label=m)
        if summary[m].get("acceptance_by_position"):
            rates = summary[m]["acceptance_by_position"]
            right.plot(range(1, len(rates) + 1), rates, marker="o", label=m)
    left.set_xlabel("tokens per target forward (tau), per prompt")
    left.legend(fontsize=8)
    right.set_xlabel("draft position")
    right.set_ylabel("steps whose j-th draft was accepted")
    right.legend(fontsize=8)
    files.append(_save(fig, out_dir / "tau_and_acceptance.png"))
    if result.cost_curve:
        fig, ax = plt.subplots(figsize=(6, 4))
        sizes = sorted(result.cost_curve)
        ax.plot(sizes, [1000 * result.cost_curve[n] for n in sizes], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens per forward")
        ax.set_ylabel("target forward time (ms)")
        files.append(_save(fig, out_dir / "verify_cost_curve.png"))
    return files


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
