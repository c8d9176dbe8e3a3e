"""A benchmark run as the markdown a page embeds: one table of the methods against plain `generate()`, and the
one "Measured on" line that says what ran, where and with which command (`results.md`, beside `results.json`)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from typing import Any

from hf_specdec.bench.methods import Method
from hf_specdec.trees.dynamic import DynamicTree

# How a placeholder of `Method.kwargs` reads in a table.
_PLACEHOLDERS = {"{draft}": "draft", "{draft_int8}": "int8 draft", "{draft_vocab}": "draft vocabulary"}


def call_text(method: Method) -> str:
    """`method`'s `generate()` arguments as a reader would write them (`assistant=draft, tree=16`; none: `""`), and
    which heads decode when they have a name (`medusa=True, tree=8 (heads eagle3)`)."""
    parts = []
    for key, value in method.kwargs.items():
        if isinstance(value, str):
            shown = _PLACEHOLDERS.get(value, repr(value))
        elif isinstance(value, DynamicTree):
            shown = f"DynamicTree(num_nodes={value.num_nodes})"
        else:
            shown = repr(value)
        parts.append(f"{key}={shown}")
    call = ", ".join(parts)
    return call if method.heads is None else f"{call} (heads {method.heads})"


def machine(device: str) -> str:
    """The hardware in words: the GPU's name, or the CPU's model, the vector instructions torch uses on it (bf16
    runs several times faster with AVX512-BF16 or AMX than with AVX2 alone: figures from the two do not compare) and
    its number of cores."""
    import torch

    from hf_specdec.machine import cpuinfo

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"one {torch.cuda.get_device_name(torch.device(device))}"
    model = cpuinfo("model name") or platform.processor() or platform.machine()
    capability = torch.backends.cpu.get_cpu_capability()
    return f"a {os.cpu_count()}-core CPU ({model}, {capability}, {torch.get_num_threads()} threads)"


def command_line() -> str:
    """The command that is running, as typed (`hf-specdec bench ...`)."""
    return shlex.join(["hf-specdec", *sys.argv[1:]])


def format_markdown(summary: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    """The results table (method, arguments, tokens/s, against plain and transformers' `assistant_model`, tau,
    outputs identical to plain greedy) and its "Measured on" line."""
    arguments = settings.get("arguments", {})
    compare_hf = any(e.get("speedup_vs_hf_assistant") for e in summary.values())
    header = ["method", "`generate()` arguments", "tokens/s", "vs plain"]
    header += ["vs transformers' `assistant_model`"] if compare_hf else []
    header += ["tau", "identical to plain"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, entry in summary.items():
        call = arguments.get(name)
        shown = "" if call is None else f"`{call}`" if call else "plain `generate()`"
        cells = [f"`{name}`", shown, f"{entry['tokens_per_second']:.2f}"]
        cells.append(_times(entry.get("speedup_vs_plain")))
        cells += [_times(entry.get("speedup_vs_hf_assistant"))] if compare_hf else []
        cells += [f"{entry['tau']:.2f}" if entry.get("tau") else "", _identity(entry)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + measured_on(settings) + "\n"


def measured_on(settings: dict[str, Any]) -> str:
    """One line: date, versions, hardware, models, dtype, prompts, batch, new tokens and the command."""
    at = {"date": datetime.date.today().isoformat(), "command": command_line()} | settings
    models = at.get("target", "?")
    if at.get("draft") not in (None, "none"):
        models += f" drafted by {at['draft']}"
    if at.get("medusa"):
        models += f", heads {at['medusa']}"
    for name, source in (at.get("heads") or {}).items():
        models += f", heads {name} {source}"
    decoding = "sampling" if at.get("do_sample") else "greedy"
    return (
        f"Measured on {at['date']}: hf_specdec {at.get('version', '?')}, {at.get('machine', '?')}, "
        f"torch {at.get('torch', '?')}, transformers {at.get('transformers', '?')}; {models}; "
        f"{at.get('dtype', '?')}, {decoding}, batch {at.get('batch_size', '?')}, {at.get('n', '?')} prompts from "
        f"{at.get('prompts', '?')}, {at.get('max_new_tokens', '?')} new tokens; `{at['command']}`."
    )


def _times(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _identity(entry: dict[str, Any]) -> str:
    identical = entry.get("identical_to_plain")
    if identical is None:
        return ""
    divergences = entry.get("divergences") or []
    gaps = [abs(d["gap"]) for d in divergences if d.get("gap") is not None]
    return identical + (f" (the others: logit gap <= {max(gaps):g})" if gaps else "")
