"""Side by side: plain `generate()` against `generate(assistant=draft)` on real models and prompts.

Before any timing, both models run on every path once (a short warm-up), so that no path pays for first-call
work (memory allocation, kernel selection) inside its timing; each path is then timed `REPEATS` times, in turn,
and the run of median time is the one shown, with the range of all its runs.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

import hf_specdec
from hf_specdec.api.entry import DEFAULT_NUM_ASSISTANT_TOKENS
from hf_specdec.bench.demo_verdict import partings, verdict_lines
from hf_specdec.bench.prompts import chat_inputs
from hf_specdec.machine import available_memory, cpu_case, slow_bf16_warning
from hf_specdec.zoo import load_model

# One prompt: batch size 1, the latency case. Pass several --prompt for a batch.
DEFAULT_PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, with a docstring."]
REPEATS = 3  # timed runs per path; the median one is shown
WARM_UP_TOKENS = 16  # new tokens of each path's warm-up run
LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens of the third path


@dataclass
class Run:
    """One timed generation."""

    sequences: torch.Tensor
    seconds: float
    new_tokens: int
    stats: hf_specdec.SpeculativeStats | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds


@dataclass
class Timings:
    """The timed runs of one path."""

    runs: list[Run]

    @property
    def median(self) -> Run:
        """The run of median time (the faster of the two middle ones for an even count): its time, text and
        statistics are the ones shown."""
        return sorted(self.runs, key=lambda run: run.seconds)[(len(self.runs) - 1) // 2]

    @property
    def seconds(self) -> float:
        return self.median.seconds

    def spread(self) -> str:
        """The range of the runs' times, e.g. ` (3 runs: 1.80-2.10 s)`, empty for a single run."""
        if len(self.runs) == 1:
            return ""
        times = [run.seconds for run in self.runs]
        return f" ({len(times)} runs: {min(times):.2f}-{max(times):.2f} s)"


@dataclass(frozen=True)
class StepReport:
    """The verification steps of a speculative `generate()` call, from its `SpeculativeStats`.

    A step is one target forward after the prefill (over all rows of the batch). A plain step verifies each row's
    last token alone: nothing was drafted, because the speculation gate chose it (to measure what a plain step
    costs, or where drafting was not expected to pay) or because the drafter proposed nothing.
    """

    steps: int
    plain_steps: int  # steps in which no row drafted (verification width 1)
    gate_steps: int  # of which the speculation gate chose
    drafted_tokens: int  # over all rows
    accepted_tokens: int
    tau: float  # tokens committed per target forward of a row, plain steps included

    @property
    def drafted_steps(self) -> int:
        return self.steps - self.plain_steps

    @classmethod
    def of(cls, stats: hf_specdec.SpeculativeStats) -> StepReport:
        summary = stats.summary()
        return cls(
            steps=sum(stats.verify_widths.values()),
            plain_steps=stats.verify_widths.get(1, 0),
            gate_steps=stats.plain_steps,
            drafted_tokens=int(summary["drafted_tokens"]),
            accepted_tokens=int(summary["accepted_tokens"]),
            tau=summary["tau"],
        )

    def lines(self, batch_size: int) -> list[str]:
        """Two lines: how many steps drafted and how many were plain (and why), then what the drafts brought."""
        why = []
        if self.gate_steps:
            why.append(f"{self.gate_steps} chosen by the speculation gate, to measure a plain step or where drafting")
            why[-1] += " would not pay"
        if self.plain_steps > self.gate_steps:
            why.append(f"{self.plain_steps - self.gate_steps} where the drafter proposed nothing")
        acceptance = self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0
        per_row = " per row" if batch_size > 1 else ""
        return [
            f"steps (target forwards after the prefill): {self.steps}, {self.drafted_steps} drafted, "
            f"{self.plain_steps} plain (nothing drafted)" + "".join(f"; {reason}" for reason in why),
            f"drafted steps: {self.drafted_tokens} tokens drafted, {self.accepted_tokens} accepted ({acceptance:.0%}); "
            f"all steps: {self.tau:.2f} tokens per target forward{per_row} (accepted drafts + 1)",
        ]


def _count_new(sequences: torch.Tensor, prompt_length: int, pad_token_id: int | None) -> int:
    new = sequences[:, prompt_length:]
    return int((new != pad_token_id).sum()) if pad_token_id is not None else new.numel()


def timed_generate(model: PreTrainedModel, inputs: dict, pad: int | None, **kwargs: Any) -> Run:
    start = time.perf_counter()
    out = model.generate(**inputs, return_dict_in_generate=True, **kwargs)
    if out.sequences.is_cuda:
        torch.cuda.synchronize(out.sequences.device)
    seconds = time.perf_counter() - start
    new = _count_new(out.sequences, inputs["input_ids"].shape[1], pad)
    return Run(out.sequences, seconds, new, getattr(out, "speculative", None))


def warm_up(target: PreTrainedModel, inputs: dict, paths: dict[str, dict[str, Any]]) -> None:
    """Run every path once on a few tokens, untimed: the target on all of them, the draft on those that use it
    (told that drafting costs nothing, so that the draft runs however little a warm-up's few tokens repay it)."""
    for name, kwargs in paths.items():
        start = time.perf_counter()
        warm = dict(kwargs, max_new_tokens=min(kwargs["max_new_tokens"], WARM_UP_TOKENS))
        if "assistant" in warm:
            warm["speculative_costs"] = hf_specdec.SpeculativeCosts(0.0, 0.0)
        target.generate(**inputs, **warm)
        print(f"  warm-up, {name}: {time.perf_counter() - start:.1f} s", flush=True)


def time_paths(
    target: PreTrainedModel, inputs: dict, pad: int | None, paths: dict[str, dict[str, Any]], repeats: int
) -> dict[str, Timings]:
    """Time each path `repeats` times, the paths in turn (so that a slow spell of the machine falls on all), with a
    line per run."""
    runs: dict[str, list[Run]] = {name: [] for name in paths}
    for repeat in range(repeats):
        for name, kwargs in paths.items():
            run = timed_generate(target, inputs, pad, **kwargs)
            runs[name].append(run)
            print(f"  timed run {repeat + 1} of {repeats}, {name}: {run.seconds:.1f} s", flush=True)
    return {name: Timings(path_runs) for name, path_runs in runs.items()}


def settings_line(
    batch_size: int,
    dtype: torch.dtype,
    device: torch.device,
    max_new_tokens: int,
    num_assistant_tokens: int | None,
    pack_linears: bool = False,
) -> str:
    drafts = num_assistant_tokens if num_assistant_tokens is not None else DEFAULT_NUM_ASSISTANT_TOKENS
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
    threads = torch.get_num_threads()
    linears = "through oneDNN over packed weights" if pack_linears else "as torch runs them"
    return (
        f"settings: greedy (do_sample=False), batch size {batch_size}, {str(dtype).removeprefix('torch.')}, "
        f"device {where}, {threads} torch thread{'s' if threads > 1 else ''}, up to {max_new_tokens} new tokens, "
        f"drafts of up to {drafts} tokens per step (adaptive), linear layers {linears}"
    )


def run_demo(
    target_name: str,
    draft_name: str,
    prompts: list[str],
    max_new_tokens: int,
    dtype: torch.dtype,
    num_assistant_tokens: int | None,
    repeats: int = REPEATS,
    pack_linears: bool = False,
) -> bool:
    """Print the prompts, the settings, both generations with their speed and the speculative steps (after a
    warm-up of both models, each path timed `repeats` times, a line per run), and the verdict on the runs shown
    (`demo_verdict`); returns whether every speculative run gave plain `generate()`'s tokens (in bfloat16: parted
    from them only at numerical ties). `pack_linears`: both models' linear layers through oneDNN
    (`hf_specdec.pack_linears`), for plain and speculative decoding alike."""
    print(f"loading target {target_name} and draft {draft_name} ({dtype}) ...", flush=True)
    start = time.perf_counter()
    target, tokenizer = load_model(target_name, dtype=dtype)
    print(f"  target loaded ({time.perf_counter() - start:.0f} s)", flush=True)
    draft, _ = load_model(draft_name, dtype=dtype)
    print(f"  draft loaded ({time.perf_counter() - start:.0f} s)", flush=True)
    hf_specdec.speculative(target)
    if pack_linears:
        _warn_if_packing_does_not_fit(target, draft)
        hf_specdec.pack_linears(target)
        hf_specdec.pack_linears(draft)
    if (slow := slow_bf16_warning(str(target.device), dtype)) is not None:
        print(f"warning: {slow}", file=sys.stderr, flush=True)
    inputs = chat_inputs(tokenizer, prompts)
    pad = tokenizer.pad_token_id
    greedy: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    spec = dict(greedy, assistant=draft)
    if num_assistant_tokens is not None:
        spec["num_assistant_tokens"] = num_assistant_tokens
    paths = {"plain": greedy, "draft": spec, "draft + lookup": dict(spec, prompt_lookup_num_tokens=LOOKUP_TOKENS)}

    for i, prompt in enumerate(prompts):
        print(f"prompt{f' {i + 1}' if len(prompts) > 1 else ''}: {prompt}")
    print(settings_line(len(prompts), dtype, target.device, max_new_tokens, num_assistant_tokens, pack_linears))
    if target.device.type == "cpu":
        print(cpu_case())
    runs = f"{repeats} runs of each path in turn; the median is shown" if repeats > 1 else "one run of each path"
    print(f"timing: an untimed warm-up of both models on every path, then {runs}")
    print(
        "  (times still vary with the machine's load, and draft lengths and plain steps follow costs measured "
        "while decoding)",
        flush=True,
    )
    warm_up(target, inputs, paths)
    timings = time_paths(target, inputs, pad, paths, repeats)
    plain, fast, both = timings["plain"], timings["draft"], timings["draft + lookup"]

    prompt_length = inputs["input_ids"].shape[1]
    for title, path in (("plain generate()", plain), ("generate(assistant=draft)", fast)):
        run = path.median
        print(
            f"\n=== {title}: {run.new_tokens} tokens in {run.seconds:.2f} s{path.spread()}, "
            f"{run.tokens_per_second:.1f} tokens/s"
        )
        for row in run.sequences[:, prompt_length:]:
            print("---", tokenizer.decode(row, skip_special_tokens=True).strip())

    reference = plain.median
    judge = functools.partial(_verdict, target, tokenizer, reference, inputs, dtype, len(prompts))
    fast_stats = fast.median.stats
    assert fast_stats is not None
    fast_lines, fast_passed = judge(fast)
    print(f"\nspeedup {plain.seconds / fast.seconds:.2f}x (median runs)")
    for line in [*fast_lines, *StepReport.of(fast_stats).lines(len(prompts))]:
        print(line)

    both_stats = both.median.stats
    assert both_stats is not None
    both_lines, both_passed = judge(both)
    print(
        f"\nwith prompt lookup too (generate(assistant=draft, prompt_lookup_num_tokens={LOOKUP_TOKENS})): "
        f"speedup {plain.seconds / both.seconds:.2f}x, {both_stats.lookup_steps} of "
        f"{StepReport.of(both_stats).steps} steps drafted by lookup"
    )
    for line in both_lines:
        print(line)
    return fast_passed and both_passed


def _verdict(
    target: PreTrainedModel,
    tokenizer: Any,
    plain: Run,
    inputs: dict,
    dtype: torch.dtype,
    batch_size: int,
    path: Timings,
) -> tuple[list[str], bool]:
    """The verdict on `path`: its median run (the one shown) and its other timed runs against plain's median run."""
    shown = path.median
    others = [run for run in path.runs if run is not shown]
    found = [partings(target, tokenizer, plain.sequences, run.sequences, inputs) for run in [shown, *others]]
    return verdict_lines(found[0], found[1:], dtype, batch_size)


def _warn_if_packing_does_not_fit(*models: PreTrainedModel) -> None:
    """Packing keeps a second copy of every linear layer's weights: warn where the memory available cannot hold it
    (the demo's pair in float32: 18 GB at its peak, against 4.8 GB in bfloat16)."""
    needed = sum(parameter.numel() * parameter.element_size() for model in models for parameter in model.parameters())
    available = available_memory()
    if available is not None and needed > available:
        print(
            f"warning: packing the linear layers keeps a second copy of their weights, about {needed / 1e9:.1f} GB "
            f"more, and {available / 1e9:.1f} GB of memory is available: the machine may swap or stop the run. "
            "Pass --no-pack-linears (slower float32 products), or run where more memory is free.",
            file=sys.stderr,
            flush=True,
        )
